"""Small sample files of every format qgpu-dask reads, for trying the API and for the docs' own tests.

``write(folder)`` writes, in seconds, what the user guide loads:

- ``scan.h5`` (4-D ``/entry/data``), ``scan.npy``, ``scan.zarr``, ``scan.zspy`` (a Zarr group with the
  array at ``Experiments/__unnamed__/data``, as HyperSpy saves it) and ``stack.h5`` (a 3-D gzip frame
  stack, one chunk per frame, at ``/data``): one synthetic crystal (`io.synthetic.crystal`), 16 x 16
  scan positions of 192 x 192 uint16 counts, the size of a DECTRIS Arina's frames;
- ``t0.h5``, ``t1.h5``, ``t2.h5``: a series of the same crystal (other seeds);
- ``run7_master.h5`` and its data files: the crystal as an Arina/Eiger master links it (bitshuffle-LZ4
  chunks of one frame);
- ``scan_x16_y16.raw`` and ``empad.raw``: EMPAD frames (130 x 128 float32, 2 rows of metadata);
- ``run3.hdr``, ``run3_1.mib`` and ``run3_2.mib``: the crystal as a Merlin writes it (U16 counts, MQ1 headers,
  the acquisition split over two files);
- ``scan.dm4`` (DigitalMicrograph), ``scan_1.ser`` (TIA) and ``scan.toml`` (big-endian raw frames after a
  512-byte header in ``scan.bin``, and the descriptor saying so): the crystal again; ``events.toml``: sparse
  events (0.02 counts a pixel, 256 x 256) in LiberTEM's raw_csr layout;
- ``write_mrc``, ``write_blo`` and ``write_tvips``: MRC, NanoMegas and TVIPS files by mrcfile's and
  RosettaSciIO's writers (installed with the test extra), for tests and benchmarks, and ``write_de_positions``:
  the coordinate file of a Direct Electron movie's custom scan;
- the field's formats no library writes, by their published layouts, for tests and benchmarks:
  ``write_dm`` (DigitalMicrograph DM3/DM4), ``write_ser`` (TIA), ``write_seq`` (StreamPix), ``write_frms6``
  (PNDetector), ``write_k2is`` (Gatan K2 IS), ``write_raw`` and ``write_raw_csr`` (frames or LiberTEM's CSR
  triple, with their TOML descriptors);
- ``phase.h5``: a wave-optical simulation (`ssb.simulate`) of atomic columns seen through an
  aberrated probe (300 kV, 20 mrad, 0.5 A steps, C10 -60 A, C12 20 A at 0.5 rad), 24 x 24 x 48 x 48,
  for calibration, DPC, SSB and direct ptychography; ``drift-0.h5`` .. ``drift-2.h5``: three frames of
  a drifting crystal (16 x 16 x 48 x 48, 1 A steps, C10 -30 A), for time-series ptychography.

Each HDF5 file's ``/entry/data`` carries the optics it was made with as attributes where they are known.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import h5py
import hdf5plugin
import numpy as np
import zarr

from .io.readers.empad import STORED_ROWS
from .io.synthetic import crystal
from .phase import simulate
from .phase.optics import Optics

SCAN = (16, 16)
DET = (192, 192)
PHASE_OPTICS = Optics(300e3, 20.0, 0.5, aberrations={"C10": -60.0, "C12": 20.0, "phi12": 0.5})
PHASE_SCAN, PHASE_DET, PHASE_OVER = (24, 24), (48, 48), 4
DRIFT_OPTICS = Optics(300e3, 20.0, 1.0, aberrations={"C10": -30.0})
DRIFT_SCAN, DRIFT_DET, DRIFT_OVER = (16, 16), (48, 48), 3
DM_IMAGE_TYPES = {np.dtype(k): v for k, v in {"int16": 1, "float32": 2, "uint8": 6, "int32": 7, "int8": 9, "uint16": 10,
                                              "uint32": 11, "float64": 12}.items()}  # a DM image's DataType
DM_ELEMENT_TYPES = {np.dtype(k): v for k, v in {"int16": 2, "int32": 3, "uint16": 4, "uint32": 5, "float32": 6, "float64": 7,
                                                "int8": 9, "uint8": 10}.items()}  # a DM tag array's element type
SER_TYPES = {np.dtype(k): v for k, v in {"uint8": 1, "uint16": 2, "uint32": 3, "int8": 4, "int16": 5, "int32": 6, "float32": 7,
                                         "float64": 8}.items()}  # a TIA element's data type


def write_hdf5(path: Path, data: np.ndarray, optics: Optics | None = None, **dataset) -> Path:
    """``data`` at ``/entry/data`` of a new HDF5 file (h5py dataset keywords pass through)."""
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("/entry/data", data=data, **dataset)
        if optics is not None:
            ds.attrs.update({"energy_eV": optics.energy_eV, "semiangle_mrad": optics.semiangle_mrad, "scan_step_A": optics.scan_step_A})
    return path


def write_arina(folder: Path, frames: np.ndarray, per_file: int, stem: str = "scan") -> Path:
    """A master and its data files as a DECTRIS Arina writes them: one bitshuffle-LZ4 chunk per frame,
    ``per_file`` frames a data file; returns the master's path."""
    n, rows, cols = frames.shape
    links = []
    for k, lo in enumerate(range(0, n, per_file), start=1):
        data = f"{stem}_data_{k:06d}.h5"
        with h5py.File(folder / data, "w") as f:
            f.create_dataset("/entry/data/data", data=frames[lo : lo + per_file], chunks=(1, rows, cols),
                             **hdf5plugin.Bitshuffle(nelems=0, cname="lz4"))
        links.append(data)
    master = folder / f"{stem}_master.h5"
    with h5py.File(master, "w") as f:
        for k, data in enumerate(links, start=1):
            f[f"/entry/data/data_{k:06d}"] = h5py.ExternalLink(data, "/entry/data/data")
        f["/entry/instrument/detector/description"] = "Dectris Arina (sample layout)"
    return master


def write_empad(path: Path, frames: np.ndarray) -> Path:
    """``frames`` (n, 128, 128) as an EMPAD .raw file: float32, two rows of metadata (zeros) after each."""
    stored = np.zeros((len(frames), STORED_ROWS, frames.shape[2]), "<f4")
    stored[:, : frames.shape[1]] = frames
    path.write_bytes(stored.tobytes())
    return path


def merlin_frame_header(seq: int, shape: tuple[int, int], pixel: str, depth: int, chips: int = 1, layout: str = "1x1") -> bytes:
    """The MQ1 header of frame ``seq`` (from 1) of ``shape`` (the header's Y, X) as Merlin software 1.x writes it:
    384 bytes for one chip, 768 for four, NUL-padded."""
    size = 384 if chips == 1 else 768
    dacs = ",".join(["3RX"] + ["000"] * 27)
    fields = ["MQ1", f"{seq:06d}", f"{size:05d}", f"{chips:02d}", f"{shape[1]:04d}", f"{shape[0]:04d}", pixel, f"{layout:>6}",
              "01" if chips == 1 else "0F", "2026-12-03 12:00:00.000000", "0.001000", "0", "0", "0",
              "1.200000E+2", *["0.000000E+0"] * 7, *[dacs] * chips, "MQ1A", "2026-12-03T12:00:00.000000000Z", "1000000ns", str(depth), ""]
    text = ",".join(fields).encode()
    return text + bytes(size - len(text))


def merlin_hdr(frames: int, per_trigger: int, depth: int, chips: int = 1, scan: tuple[int, int] | None = None) -> bytes:
    """A Merlin acquisition header (the .hdr file's text, and the HDR message's): ``frames`` announced,
    ``per_trigger`` a trigger, ScanX and ScanY where ``scan`` is given."""
    lines = ["HDR,\t", "Time and Date Stamp (day, mnth, yr, hr, min, s):\t03/12/2026 12:00:00", "Chip ID:\tW529_F5,-,-,-",
             "Chip Type (Medipix 3.0, Medipix 3.1, Medipix 3RX):\tMedipix 3RX",
             f"Assembly Size (NX1, 2X2):\t{'   1x1' if chips == 1 else '   2x2'}", "Chip Mode  (SPM, CSM, CM, CSCM):\tSPM",
             f"Counter Depth (number):\t{depth}", "Gain:\tSLGM", "Active Counters:\tAlternating",
             "Acquisition Type (Normal, Th_scan, Config):\tNormal", f"Frames in Acquisition (Number):\t{frames}",
             f"Frames per Trigger (Number):\t{per_trigger}", "Trigger Start (Positive, Negative, Internal):\tRising Edge LVDS",
             "Readout System:\tMerlin Quad", "Software Version:\t1.6.0"]
    if scan is not None:
        lines += [f"ScanX:\t{scan[1]}", f"ScanY:\t{scan[0]}"]
    return ("\n".join(lines + ["End\t"])).encode("latin-1")


def write_merlin(folder: Path, stem: str, pixels: np.ndarray, shape: tuple[int, int], scan: tuple[int, int], pixel: str = "U16",
                 depth: int = 12, chips: int = 1, layout: str = "1x1", files: int = 1, scan_in_header: bool = True) -> Path:
    """Frames as a Merlin writes them: ``stem.hdr`` and ``stem_1.mib`` .. ``stem_{files}.mib`` (the frames split
    evenly, in scan order), each frame an MQ1 header and its pixel bytes ``pixels[i]`` ((n, bytes) uint8,
    encoded as ``pixel`` says); ``shape`` is the headers' (Y, X). Returns the .hdr path."""
    per_file = -(-len(pixels) // files)
    for k in range(files):
        with open(folder / f"{stem}_{k + 1}.mib", "wb") as f:
            for i in range(k * per_file, min((k + 1) * per_file, len(pixels))):
                f.write(merlin_frame_header(i + 1, shape, pixel, depth, chips, layout))
                f.write(pixels[i].tobytes())
    hdr = folder / f"{stem}.hdr"
    hdr.write_bytes(merlin_hdr(len(pixels), scan[1], depth, chips, scan if scan_in_header else None))
    return hdr


def write_dectris_series(path: Path, frames: np.ndarray, series: int = 7, lz4: bool = False) -> Path:
    """``frames`` (n, rows, cols) as a DECTRIS stream v1 series (header_detail basic, trigger mode exte, blobs
    bitshuffle-LZ4 as HDF5's filter 32008 writes them, or with ``lz4`` one LZ4 block of each frame) recorded
    the way LiberTEM-live's DECTRIS simulator replays it: each part (header, configuration, 4 parts an image,
    end) as an int64 little-endian length and its bytes. Returns ``path``."""
    n, rows, cols = frames.shape
    bits = 8 * frames.dtype.itemsize
    if lz4:
        from numcodecs import LZ4

        blobs = [LZ4().encode(np.ascontiguousarray(frame, frames.dtype.newbyteorder("<")))[4:] for frame in frames]  # without its size prefix
    else:
        chunks = path.with_name(f"{path.name}.chunks.h5")
        with h5py.File(chunks, "w") as f:
            f.create_dataset("d", data=frames, chunks=(1, rows, cols), **hdf5plugin.Bitshuffle(nelems=0, cname="lz4"))
        with h5py.File(chunks, "r") as f:
            blobs = [f["d"].id.read_direct_chunk((k, 0, 0))[1] for k in range(n)]
        chunks.unlink()
    config = {"trigger_mode": "exte", "ntrigger": n, "nimages": 1, "x_pixels_in_detector": cols, "y_pixels_in_detector": rows,
              "bit_depth_image": bits, "compression": "bslz4", "count_time": 0.001, "frame_time": 0.001}
    parts = [json.dumps({"htype": "dheader-1.0", "series": series, "header_detail": "basic"}).encode(), json.dumps(config).encode()]
    for k, blob in enumerate(blobs):
        parts += [json.dumps({"htype": "dimage-1.0", "series": series, "frame": k, "hash": hashlib.md5(blob).hexdigest()}).encode(),
                  json.dumps({"htype": "dimage_d-1.0", "shape": [cols, rows], "type": frames.dtype.name, "encoding": "lz4<" if lz4 else f"bs{bits}-lz4<",
                              "size": len(blob)}).encode(),
                  blob, json.dumps({"htype": "dconfig-1.0", "start_time": 0, "stop_time": 1000, "real_time": 1000}).encode()]
    parts.append(json.dumps({"htype": "dseries_end-1.0", "series": series}).encode())
    path.write_bytes(b"".join(struct.pack("<q", len(part)) + part for part in parts))
    return path


def dm_word(value: int, version: int) -> bytes:
    return struct.pack(">Q" if version == 4 else ">I", value)


def dm_data_tag(value, version: int) -> bytes:
    """``%%%%``, the type words and the payload of a data tag holding ``value``."""
    if isinstance(value, np.ndarray):
        info, payload = [20, DM_ELEMENT_TYPES[value.dtype.newbyteorder("=")], value.size], value.astype(value.dtype.newbyteorder("<")).tobytes()
    elif isinstance(value, str):  # text as an array of UTF-16 code units, as GMS keeps it
        units = np.frombuffer(value.encode("utf-16-le"), "<u2")
        info, payload = [20, 4, units.size], units.tobytes()
    elif isinstance(value, bool):
        info, payload = [8], struct.pack("<B", value)
    elif isinstance(value, int):
        info, payload = [5], struct.pack("<I", value)
    else:
        info, payload = [6], struct.pack("<f", value)
    return b"%%%%" + dm_word(len(info), version) + b"".join(dm_word(i, version) for i in info) + payload


def dm_group(entries: list[tuple[str, object]], version: int) -> bytes:
    """A tag group of (label, value) entries: a value that is a list is a group."""
    out = b"\x01\x00" + dm_word(len(entries), version)
    for label, value in entries:
        body = dm_group(value, version) if isinstance(value, list) else dm_data_tag(value, version)
        out += struct.pack(">BH", 20 if isinstance(value, list) else 21, len(label)) + label.encode("latin-1")
        out += (struct.pack(">Q", len(body)) if version == 4 else b"") + body
    return out


def write_dm(path: Path, data: np.ndarray, version: int = 4, swapped: bool = True, thumbnail: bool = True) -> Path:
    """``data`` (C order) as the image of a DigitalMicrograph file by its tag-file layout (big-endian structure
    words, 4 bytes in DM3 and 8 in DM4, where each tag also says its size; little-endian payloads), after a 2-D thumbnail where asked; ``swapped``: tag the
    image's order as C (``Data Order Swapped``)."""
    def image(array: np.ndarray, meta: list, code: int | None = None) -> list:
        dims = [("", int(d)) for d in array.shape[::-1]]  # fastest first
        calibration = [("", [("Origin", 0.0), ("Scale", 1.0), ("Units", "")]) for _ in dims]
        return [("ImageData", [("Calibrations", [("Brightness", [("Origin", 0.0), ("Scale", 1.0), ("Units", "")]), ("Dimension", calibration)]),
                               ("Data", array), ("DataType", code or DM_IMAGE_TYPES[array.dtype]), ("Dimensions", dims),
                               ("PixelDepth", array.dtype.itemsize)]),
                ("ImageTags", [("Meta Data", meta)]), ("Name", "test")]

    meta = [("Format", "Diffraction image")] + ([("Data Order Swapped", True)] if swapped else [])
    rgba = 23  # a thumbnail's DataType: 8-bit RGBA, a uint32 a pixel
    images = ([("", image(np.zeros((8, 8), np.uint32), [], rgba))] if thumbnail else []) + [("", image(data, meta))]
    thumbnails = [("Thumbnails", [("", [("ImageIndex", 0)])])] if thumbnail else []  # how a reader knows image 0 for one
    body = dm_group([("ImageList", images)] + thumbnails, version)
    with open(path, "wb") as f:
        f.write(struct.pack(">I", version) + dm_word(len(body) + 8, version) + struct.pack(">I", 1) + body + bytes(8))
    return path


def write_ser(path: Path, data: np.ndarray, version: int = 0x220) -> Path:
    """``data`` (scan rows, scan cols, det...) or (frames, det...) as a .ser file; ``version`` 0x220 (8-byte
    offsets) or 0x210 (4-byte)."""
    scan, (height, width) = data.shape[:-2], data.shape[-2:]
    frames = data.reshape(-1, height, width)
    offset = "<q" if version == 0x220 else "<i"
    dims = list(scan[::-1])  # the first dimension is the faster (x)
    out = bytearray(struct.pack("<HHHiiii", 0x4949, 0x0197, version, 0x4122, 0x4142, len(frames), len(frames)))
    arrays_at = len(out)
    out += struct.pack(offset, 0) + struct.pack("<i", len(dims))
    for size in dims:
        out += struct.pack("<iddi", size, 0.0, 1e-9, 0) + struct.pack("<i", 8) + b"Position" + struct.pack("<i", 6) + b"meters"
    elements, tags = [], []
    for k, frame in enumerate(frames):
        elements.append(len(out))
        out += struct.pack("<ddiddi", 0.0, 1.0, 0, 0.0, 1.0, 0) + struct.pack("<hii", SER_TYPES[frame.dtype], width, height)
        out += frame[::-1].astype(frame.dtype.newbyteorder("<")).tobytes()
        tags.append(len(out))
        y, x = divmod(k, dims[0]) if len(dims) == 2 else (0, k)
        out += struct.pack("<HHIdd", 0x4142, 0, 0, x * 1e-9, y * 1e-9)
    struct.pack_into(offset, out, arrays_at, len(out))
    out += np.array(elements + tags, offset).tobytes()
    path.write_bytes(bytes(out))
    return path


def write_seq(path: Path, frames: np.ndarray, footer: int = 8, version: int = 5) -> Path:
    """``frames`` (n, det...) as a .seq file by its published layout: the header, each frame and a footer."""
    n, height, width = frames.shape
    bits = frames.dtype.itemsize * 8
    header = bytearray(8192 if version >= 5 else 1024)
    struct.pack_into("<I24sii512s", header, 0, 0xFEED, "Norpix seq\0".encode("utf-16-le")[:24], version, 1024,
                     "a test\0".encode("utf-16-le"))
    struct.pack_into("<9I", header, 548, width, height, bits, bits, frames[0].nbytes, 100, n, 0, frames[0].nbytes + footer)
    with open(path, "wb") as f:
        f.write(header)
        for frame in frames:
            f.write(frame.astype(frame.dtype.newbyteorder("<")).tobytes() + b"\x77" * footer)
    return path


def write_frms6(folder: Path, counts: np.ndarray, per_file: int = 7, dark: int = 2) -> Path:
    """``counts`` (scan..., 2h, w) as a .frms6 acquisition by its published layout: the .hdr, ``dark`` dark frames
    in _000 and the scan's frames, folded as the camera reads them out, ``per_file`` a file from _001."""
    rows, cols, height, width = counts.shape
    frames = counts.reshape(-1, height, width)
    folded = np.concatenate([frames[:, : height // 2], frames[:, height // 2 :, ::-1][:, ::-1]], axis=2)  # (n, h, 2w)

    def write(path, stored):
        header = bytearray(1024)
        struct.pack_into("<HH", header, 0, 1024, 64)
        header[7] = 6
        struct.pack_into("<HH", header, 88, 2 * width, height // 2)
        struct.pack_into("<I", header, 1020, len(stored))
        with open(path, "wb") as f:
            f.write(header)
            for k, frame in enumerate(stored):
                f.write(struct.pack("<III", 0, 0, k).rjust(64, b"\0") + frame.astype("<u2").tobytes())

    write(folder / "run_000.frms6", np.full((dark, height // 2, 2 * width), 5, np.uint16))
    for part, lo in enumerate(range(0, len(frames), per_file)):
        write(folder / f"run_{part + 1:03d}.frms6", folded[lo : lo + per_file])
    (folder / "run.hdr").write_text(f'[measurementInfo]\ndarkframes={dark}\nsignalframes={len(frames)}\nstemimagesize={rows}x{cols}\n'
                                    f'readoutmode="bin: 1, windowing: {height} x {width}"\ndwelltimemicroseconds=100\ngain=1\n')
    return folder / "run.hdr"


def write_k2is(folder: Path, counts: np.ndarray, lead: int = 2, after: int = 1, torn: tuple[int, ...] = (3, 8, 13, 18, 23, 28, 1, 6),
               scan_in_gtg: bool = True, stem: str = "capture") -> Path:
    """``counts`` (scan..., 1860, 2048; below 4096) as a Gatan K2 IS acquisition by its published layout:
    ``<stem>_.gtg`` (a DM4 tag file, the scan as ``SI Dimensions`` where ``scan_in_gtg``) and the eight sector
    files ``<stem>_1.bin`` .. ``_8.bin`` of 0x5758-byte blocks (``io.readers.k2is`` describes them). The camera's
    frames are ``lead`` frames before the scan, the scan's and ``after`` frames after it, the shutter flag set
    from the scan's second frame (the camera sets it a frame late) where the .gtg gives the scan, else from its
    first. Sector file s starts ``torn[s]`` blocks before the end of the frame before those, and every sector
    file holds as many blocks (a sector that starts torn ends torn). The .gtg's path."""
    rows, cols, height, width = counts.shape
    if (height, width) != (1860, 2048) or counts.max(initial=0) >= 4096:
        raise ValueError(f"K2 IS frames are 1860 x 2048 counts of 12 bits; got {height} x {width}, largest {counts.max(initial=0)}")
    outside = lambda value: np.full((height, width), value, np.uint16)  # a frame outside the scan, each its own value
    frames = [outside(4000), *map(outside, range(3000, 3000 + lead)), *counts.reshape(-1, height, width),
              *map(outside, range(2000, 2001 + after))]
    shutter = 1 + lead + (1 if scan_in_gtg else 0)  # the first frame with the shutter flag set
    files = [open(folder / f"{stem}_{s + 1}.bin", "wb") for s in range(8)]
    try:
        for f, frame in enumerate(frames):
            # sector s, its block k = 16 y + x: rows 930 y .., columns 256 s + 16 (15 - x) ..; two counts in three bytes
            pixels = frame.reshape(2, 930, 8, 16, 16).transpose(2, 0, 3, 1, 4)[:, :, ::-1].reshape(8, 32, -1)
            low, high = pixels[..., 0::2], pixels[..., 1::2]
            blocks = np.empty((8, 32, 0x5758), np.uint8)
            data = blocks[..., 40:]
            data[..., 0::3], data[..., 1::3], data[..., 2::3] = low & 0xFF, (low >> 8) | (high & 0xF) << 4, high >> 4
            for k in range(32):  # sync word, version, flags (bit 0: shutter open), block counter, width, height, frame id, pixels, size
                x, y = (15 - k % 16) * 16, k // 16 * 930
                head = struct.pack(">I4xBB6xIHHIHHHHI", 0xFFFF0055, 0, f >= shutter, 7 + 32 * f + k, 256, 1860, 100 + f,
                                   x, y, x + 15, y + 929, 0x5758)
                blocks[:, k, :40] = np.frombuffer(head, np.uint8)
            for s, out in enumerate(files):
                first = 32 - torn[s]  # where the sector's file begins, in the first frame; where it ends, in the last
                out.write(blocks[s, first if f == 0 else 0 : first if f == len(frames) - 1 else 32].tobytes())
    finally:
        for out in files:
            out.close()
    gtg = [("ImageList", [])] + ([("SI Dimensions", [("Size X", int(cols)), ("Size Y", int(rows))])] if scan_in_gtg else [])
    body = dm_group(gtg, 4)
    path = folder / f"{stem}_.gtg"
    path.write_bytes(struct.pack(">I", 4) + dm_word(len(body) + 8, 4) + struct.pack(">I", 1) + body + bytes(8))
    return path


def write_raw(folder: Path, counts: np.ndarray, dtype: str, offset: int = 0, gap: int = 0) -> Path:
    """``counts`` (scan..., det...) as raw frames of ``dtype`` in ``scan.bin`` after ``offset`` bytes, ``gap``
    bytes of header before each frame but the first, and ``scan.toml`` describing them; the descriptor's path."""
    frames = counts.reshape(-1, counts.shape[2] * counts.shape[3]).astype(dtype)
    with open(folder / "scan.bin", "wb") as f:
        f.write(b"\xee" * offset)
        for k, frame in enumerate(frames):
            f.write((b"\x5a" * gap if k else b"") + frame.tobytes())
    return descriptor(folder / "scan.toml", "raw", counts.shape, {"data_file": "scan.bin", "dtype": dtype, "offset": offset,
                                                                   "stride": frames[0].nbytes + gap})


def write_raw_csr(folder: Path, counts: np.ndarray, dtypes: tuple[str, str, str] = ("<i4", "<i4", "<i4")) -> Path:
    """``counts`` (scan..., det...) as LiberTEM's raw_csr triple (row pointers, indices, values of ``dtypes``) and
    ``events.toml`` describing it; the descriptor's path."""
    flat = counts.reshape(counts.shape[0] * counts.shape[1], -1)
    rows, cols = np.nonzero(flat)
    parts = {"indptr": ("rowind.dat", np.searchsorted(rows, np.arange(flat.shape[0] + 1))), "indices": ("coords.dat", cols),
             "data": ("values.dat", flat[rows, cols])}
    table = {}
    for (part, (name, array)), dtype in zip(parts.items(), dtypes):
        array.astype(dtype).tofile(folder / name)
        table |= {f"{part}_file": name, f"{part}_dtype": dtype}
    return descriptor(folder / "events.toml", "raw_csr", counts.shape, table)


def descriptor(path: Path, filetype: str, shape: tuple[int, ...], table: dict) -> Path:
    """A TOML descriptor (``io.readers.descriptor``) of ``filetype`` for an acquisition of ``shape``."""
    lines = ["[params]", f'filetype = "{filetype}"', f"nav_shape = {list(shape[:2])}", f"sig_shape = {list(shape[2:])}", "", f"[{filetype}]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_mrc(path: Path, frames: np.ndarray, byteorder: str = "<") -> Path:
    """``frames`` (n, det...) as an MRC stack of images (not a volume, as a camera writes it), by mrcfile's
    writer (the formats extra), its counts in ``byteorder``."""
    import mrcfile

    with mrcfile.new(path, overwrite=True) as mrc:
        mrc.set_data(frames.astype(frames.dtype.newbyteorder(byteorder)))
        mrc.set_image_stack()
    return path


def write_de_positions(path: Path, positions: np.ndarray) -> Path:
    """``positions`` (n, 2: x, y) of a scan's n frames, in the order recorded, as Direct Electron's server writes
    a custom or random scan's ``YYYYMMDD_N_scan_coordinates.csv`` beside its movie: a line "x,y" each, no header
    (integers as integers, other numbers as Python prints them)."""
    path.write_text("".join(f"{x},{y}\n" for x, y in np.asarray(positions).tolist()))
    return path


def rosettasciio_signal(data: np.ndarray, nav_units: str = "nm", sig_units: str = "cm") -> dict:
    """``data`` (scan..., det...) as the signal dict RosettaSciIO's writers take (its axes, no metadata)."""
    axes = [{"name": f"axis{i}", "size": n, "scale": 1.0, "offset": 0.0, "index_in_array": i, "navigate": i < data.ndim - 2,
             "units": nav_units if i < data.ndim - 2 else sig_units} for i, n in enumerate(data.shape)]
    return {"data": data, "axes": axes, "metadata": {}, "original_metadata": {}, "attributes": {"_lazy": False}}


def write_blo(path: Path, counts: np.ndarray) -> Path:
    """``counts`` (scan..., det...: uint8, a square detector) as a NanoMegas block file, by RosettaSciIO's writer."""
    from rsciio.blockfile import file_writer

    file_writer(str(path), rosettasciio_signal(counts), show_progressbar=False)
    return path


def write_tvips(folder: Path, frames: np.ndarray, record_limit: int | None = None, coordinates: np.ndarray | None = None,
                stem: str = "series") -> Path:
    """``frames`` (n, det...) as a TVIPS series by RosettaSciIO's writer (split into files of at most
    ``record_limit`` frames; with ``coordinates`` (n, 2) (x, y), 108-byte frame headers carrying them); the
    first file's path."""
    import warnings

    from rsciio.tvips import file_writer

    head = 60 if coordinates is None else 108
    record = head + frames[0].nbytes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its units and mode are guessed
        file_writer(str(folder / f"{stem}.tvips"), rosettasciio_signal(frames, "s", "1/nm"), show_progressbar=False,
                    max_file_size=None if record_limit is None else 256 + record_limit * record, frame_header_extra_bytes=head - 60)
    files = sorted(folder.glob(f"{stem}_*.tvips"))
    if coordinates is not None:
        at = 0
        for path in files:
            data = bytearray(path.read_bytes())
            start = 256 if path.name.endswith("_000.tvips") else 0
            for k in range((len(data) - start) // record):
                data[start + k * record + 68 : start + k * record + 76] = coordinates[at].astype("<f4").tobytes()
                at += 1
            path.write_bytes(bytes(data))
    return files[0]


def write(folder: str | Path = ".") -> dict[str, Path]:
    """Write the sample files into ``folder`` (made if missing, files overwritten); their paths by name."""
    out = Path(folder).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    scan = crystal(SCAN, DET, "uint16", seed=0)
    frames = scan.reshape(-1, *DET)
    paths = {
        "scan.h5": write_hdf5(out / "scan.h5", scan),
        "stack.h5": out / "stack.h5",
        "scan.npy": out / "scan.npy",
        "scan.zarr": out / "scan.zarr",
        "scan.zspy": out / "scan.zspy",
        "run7_master.h5": write_arina(out, frames, per_file=100, stem="run7"),
    }
    with h5py.File(paths["stack.h5"], "w") as f:
        f.create_dataset("/data", data=frames, chunks=(1, *DET), compression="gzip")
    np.save(paths["scan.npy"], scan)
    z = zarr.create_array(str(paths["scan.zarr"]), shape=scan.shape, chunks=(1, SCAN[1], *DET), dtype=scan.dtype, overwrite=True)
    z[...] = scan
    group = zarr.open_group(str(paths["scan.zspy"]), mode="w")
    group.create_array("Experiments/__unnamed__/data", shape=scan.shape, chunks=(1, SCAN[1], *DET), dtype=scan.dtype)[...] = scan
    for i in range(3):
        paths[f"t{i}.h5"] = write_hdf5(out / f"t{i}.h5", crystal(SCAN, DET, "uint16", seed=i + 1))
    empad = crystal(SCAN, (128, 128), "float32", seed=0).reshape(-1, 128, 128)
    for name in ("scan_x16_y16.raw", "empad.raw"):
        paths[name] = write_empad(out / name, empad)
    paths["run3.hdr"] = write_merlin(out, "run3", frames.astype(">u2").view(np.uint8).reshape(len(frames), -1), DET, SCAN, files=2)
    paths["scan.dm4"] = write_dm(out / "scan.dm4", scan)
    paths["scan_1.ser"] = write_ser(out / "scan_1.ser", scan)
    paths["scan.toml"] = write_raw(out, scan, ">u2", offset=512)
    events = np.random.default_rng(0).poisson(0.02, (*SCAN, 256, 256)).astype(np.uint16)
    paths["events.toml"] = write_raw_csr(out, events, ("<i8", "<u4", "<u2"))

    over = PHASE_OVER
    potential = simulate.atoms_potential((PHASE_SCAN[0] * over, PHASE_SCAN[1] * over), PHASE_OPTICS.scan_step_A / over, 3.9)
    counts = simulate.acquisition(PHASE_OPTICS, PHASE_SCAN, PHASE_DET, potential, over, dose=1e5, seed=1).astype(np.uint16)
    paths["phase.h5"] = write_hdf5(out / "phase.h5", counts, PHASE_OPTICS)
    over = DRIFT_OVER
    potential = simulate.atoms_potential((DRIFT_SCAN[0] * over, DRIFT_SCAN[1] * over), DRIFT_OPTICS.scan_step_A / over, 3.9)
    for f in range(3):
        moved = np.roll(potential, (2 * f, 5 * f), axis=(0, 1))
        counts = simulate.acquisition(DRIFT_OPTICS, DRIFT_SCAN, DRIFT_DET, moved, over, dose=1e6, seed=f).astype(np.uint16)
        paths[f"drift-{f}.h5"] = write_hdf5(out / f"drift-{f}.h5", counts, DRIFT_OPTICS)
    return paths
