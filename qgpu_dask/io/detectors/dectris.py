"""A DECTRIS detector's stream interface: a ZeroMQ PUSH socket the detector binds (9999 for version 1, the
SIMPLON "legacy" format; 31001 for stream2, CBOR), which the receiver pulls from. Which version a series
is in is told by its first message (JSON or CBOR).

A series is a header (``dheader-1.0``, then the detector configuration as JSON; with ``header_detail`` "all"
also flat field, pixel mask and count-rate table, each a JSON part and a blob), then per image a
``dimage-1.0`` part (series, frame number), a ``dimage_d-1.0`` part (shape [x, y], type, encoding), the blob
and a ``dconfig-1.0`` part, and at the end ``dseries_end-1.0``. Parts are read one by one and told apart by
their ``htype`` (LiberTEM-live's simulators send the header's two parts as two messages). Blobs encoded
``bs8-lz4<``, ``bs16-lz4<`` or ``bs32-lz4<`` are bitshuffle-LZ4 chunks in the HDF5 filter's framing (a
12-byte header, then blocks), gathered into ``batches.Chunks`` and decoded on the acquisition's device like
an Arina file's; a header of zeros (LiberTEM-live's mocked frames) is filled in with the frame's size and
the 8192-byte blocks DECTRIS writes. Blobs encoded ``lz4<`` (one LZ4 block of the whole little-endian
frame) are decoded on the receiving host's cores as they come.

A stream2 series is a start message (frame count, image size, channels), an image message per frame (its
first channel's array: "bslz4" bytes gathered into Chunks as above; "lz4" and uncompressed pixels decoded
here), and an end message (``formats.stream2``). Ends without a start (simulators send a second one on
disarm) and a series begun before the receiver are skipped.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Iterator

import numpy as np

from ...formats import stream2
from ...formats.bitshuffle_lz4 import HEADER_BYTES, OK, WILD, lz4_block, message
from ..batches import AHEAD, Chunks, decoded, host_buffers, prefetched
from ..stream import SeriesSource, check_reading

ENDPOINT_PORT = 9999
BLOCK_BYTES = 8192  # the bitshuffle block DECTRIS detectors write (in bytes)
SHUFFLED = {"bs8-lz4<": 1, "bs16-lz4<": 2, "bs32-lz4<": 4}  # bitshuffle-LZ4 encodings, by the element size they shuffle
LZ4 = "lz4<"  # one LZ4 block of the frame
BSLZ4, RAW = "bslz4", "raw"  # stream2's bitshuffle-LZ4 (as the HDF5 filter frames it), and pixels sent as they are
LATENCY_S = 0.05  # a batch is handed on after this long, full or not (a slow detector is seen live)


@dataclass(frozen=True)
class DectrisSource(SeriesSource):
    """A DECTRIS detector's stream interface at ``host``:``port`` (a series, or several in a row), read up to ``frames_per_read`` frames
    at a time."""

    host: str
    port: int = ENDPOINT_PORT
    frames_per_read: int = 256
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        check_reading(self)

    def describe(self) -> str:
        return f"tcp://{self.host}:{self.port} (DECTRIS stream v1)"

    def series(self, det_shape: tuple[int, int], dtype, counts: list[int | None], xp: ModuleType = np) -> Iterator[tuple[int, object]]:
        """(k, frames) of ``len(counts)`` consecutive series of the stream, the k-th of ``counts[k]`` frames
        (None: as its configuration says), read ahead in a thread of their own; ValueError naming the series
        and frame for frames of another shape or count, an unreadable encoding, a lost or foreign frame, a
        malformed chunk, or a stream quiet for ``timeout_s`` (the frames before it handed on first)."""
        dtype, sent = np.dtype(dtype), [0] * len(counts)
        for k, batch in prefetched(self.batches(tuple(det_shape), dtype, host_buffers(xp), list(counts)), AHEAD):
            block, bad = decoded(batch, det_shape, dtype, xp)
            if len(block):
                sent[k] += len(block)
                yield k, block
            if bad is not None:
                raise ValueError(f"{self.where(k, len(counts))} sent a malformed frame {sent[k]}: {bad.problem}")

    def batches(self, det_shape: tuple[int, int], dtype: np.dtype, buffer, counts: list[int | None]) -> Iterator[tuple[int, Chunks | np.ndarray]]:
        """(k, series k's blobs), whole frames gathered into Chunks (or decoded ``lz4<`` frames) in ``buffer``s."""
        try:
            import zmq
        except ImportError:
            raise ValueError("reading a DECTRIS stream needs pyzmq on the worker: pip install 'qgpu-dask[detectors]'") from None

        context = zmq.Context.instance()
        pull = context.socket(zmq.PULL)
        pull.setsockopt(zmq.LINGER, 0)
        pull.setsockopt(zmq.RCVTIMEO, int(self.timeout_s * 1000))
        pull.connect(f"tcp://{self.host}:{self.port}")
        try:
            for k, count in enumerate(counts):
                for batch in self.one_series(Parts(pull, self.where(k, len(counts)), self.timeout_s), det_shape, dtype, buffer, count):
                    yield k, batch
        finally:
            pull.close()

    def one_series(self, parts: "Parts", det_shape: tuple[int, int], dtype: np.dtype, buffer, count: int | None) -> Iterator[Chunks | np.ndarray]:
        """The next series' frames (its header read first; what comes before it skipped), ``count`` of them
        where given: version 1's JSON parts, or stream2's CBOR messages, told apart by the first message."""
        where, first = parts.where, parts.next()
        if stream2.is_cbor(first):
            yield from self.stream2_series(parts, first, det_shape, dtype, buffer, count)
            return
        header = parts.series_header(first)
        if header.get("header_detail") == "none":
            raise ValueError(f"{where} sends header_detail 'none': the series' frame count is in the detector configuration,"
                             " sent with 'basic' or 'all' (set the stream's header_detail)")
        config = parts.json()
        if "htype" in config:
            raise ValueError(f"{where}: the series header is followed by {config['htype']!r}, not the detector configuration")
        if header.get("header_detail") == "all":
            for _ in range(3):  # flat field, pixel mask, count-rate table: a JSON part and a blob each
                parts.json()
                parts.next()
        total = series_frames(config, where)
        shape = detector_shape(config, where)
        self.check_series(total, count, shape, det_shape, where)
        series = header.get("series")
        yield from self.batched(lambda frame: self.blob(parts, series, frame, dtype, det_shape, where), total, det_shape, dtype, buffer, where)

    def stream2_series(self, parts: "Parts", first: bytes, det_shape: tuple[int, int], dtype: np.dtype, buffer,
                       count: int | None) -> Iterator[Chunks | np.ndarray]:
        """A stream2 series: its start message (images and ends of a series begun before skipped), then its images."""
        where = parts.where
        start = stream2.decoded(first, where)
        while start["type"] != "start":
            start = stream2.decoded(parts.next(), where)
        try:
            total, shape = int(start["number_of_images"]), (int(start["image_size_y"]), int(start["image_size_x"]))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{where}: the start message lacks number_of_images, image_size_x or image_size_y") from None
        self.check_series(total, count, shape, det_shape, where)
        if start.get("image_dtype", dtype.name) != dtype.name:
            raise ValueError(f"{where} sends {start['image_dtype']!r} images, the acquisition holds {dtype}")
        channels = start.get("channels") or [None]
        if not (isinstance(channels, list) and all(c is None or isinstance(c, str) for c in channels)):
            raise ValueError(f"{where}: the start message's channels are {channels!r:.80}, not a list of names")
        channel, series = channels[0], start.get("series_id")
        yield from self.batched(lambda frame: image2(parts, series, frame, channel, det_shape, dtype, where), total, det_shape, dtype, buffer,
                                where)

    def check_series(self, total: int, count: int | None, shape: tuple[int, int], det_shape: tuple[int, int], where: str) -> None:
        if total < 1:
            raise ValueError(f"{where}: the series announces {total} frames")
        if count is not None and total != count:
            raise ValueError(f"{where}: the series has {total} frames, the acquisition holds {count}")
        if shape != det_shape:
            raise ValueError(f"{where} sends frames of {shape}, the acquisition holds {det_shape}")

    def batched(self, image, total: int, det_shape: tuple[int, int], dtype: np.dtype, buffer, where: str) -> Iterator[Chunks | np.ndarray]:
        """The series' ``total`` frames from ``image(frame)`` ((encoding, blob) of each), gathered
        ``frames_per_read`` at a time, or what came within LATENCY_S: bitshuffle-LZ4 chunks for the device,
        other encodings decoded here."""
        frame_bytes = det_shape[0] * det_shape[1] * dtype.itemsize
        sent, encodings = 0, set()
        while sent < total:
            n = min(self.frames_per_read, total - sent)
            blobs: list[bytes] = []
            since = time.perf_counter()
            failed = None
            while len(blobs) < n and (not blobs or time.perf_counter() - since < LATENCY_S):
                try:
                    encoding, blob = image(sent + len(blobs))
                    if encodings and encoding not in encodings:
                        raise ValueError(f"{where}: frame {sent + len(blobs)} is encoded {encoding!r}, the frames before it {encodings.pop()!r}")
                except ValueError as err:
                    failed = err
                    break
                encodings.add(encoding)
                blobs.append(blob)
            if blobs:  # the frames before a failure are handed on first
                if encodings & {*SHUFFLED, BSLZ4}:
                    yield gathered(blobs, frame_bytes, buffer)
                else:
                    yield unpacked(blobs, next(iter(encodings)), det_shape, dtype, buffer, sent, where)
                sent += len(blobs)
            if failed is not None:
                raise failed

    def blob(self, parts: "Parts", series, frame: int, dtype: np.dtype, det_shape: tuple[int, int], where: str) -> tuple[str, bytes]:
        """The next image's encoding and blob, its parts checked."""
        image = parts.json()
        if image.get("htype") != "dimage-1.0":
            raise ValueError(f"{where}: expected frame {frame}, got {image.get('htype')!r} (the series ended early?)")
        if image.get("series") != series or image.get("frame") != frame:
            raise ValueError(f"{where}: frame {frame} came as frame {image.get('frame')} of series {image.get('series')}"
                             f" (series {series} expected: a frame was lost, or another series began)")
        info = parts.json()
        encoding = info.get("encoding")
        if info.get("type") != dtype.name or (encoding != LZ4 and SHUFFLED.get(encoding) != dtype.itemsize):
            raise ValueError(f"{where}: frame {frame} is {info.get('type')} encoded {encoding!r}; the acquisition holds {dtype}"
                             f" (readable: {', '.join([*SHUFFLED, LZ4])}, a shuffle's element size the counts')")
        if list(info.get("shape", [])) != [det_shape[1], det_shape[0]]:
            raise ValueError(f"{where}: frame {frame} has shape [x, y] = {info.get('shape')}, the acquisition {det_shape[::-1]}")
        data = parts.next()
        parts.json()  # dconfig-1.0: the frame's times
        while parts.more():
            parts.next()  # an image appendix
        return encoding, data


class Parts:
    """The parts of a ZeroMQ PULL socket, one at a time."""

    def __init__(self, pull, where: str, timeout_s: float):
        import zmq

        self.pull, self.where, self.timeout_s, self.zmq = pull, where, timeout_s, zmq

    def next(self) -> bytes:
        try:
            return self.pull.recv(copy=True)
        except self.zmq.Again:
            raise ValueError(f"{self.where} sent nothing for {self.timeout_s:g} s") from None

    def more(self) -> bool:
        return bool(self.pull.getsockopt(self.zmq.RCVMORE))

    def series_header(self, part: bytes) -> dict:
        """The series header, ``part`` or the next; the parts before it (the rest of a series begun before this
        receiver) skipped."""
        while True:
            try:
                value = json.loads(part)
            except ValueError:
                value = None  # a blob
            if isinstance(value, dict) and value.get("htype") == "dheader-1.0":
                return value
            part = self.next()

    def json(self) -> dict:
        part = self.next()
        try:
            value = json.loads(part)
        except ValueError:
            raise ValueError(f"{self.where}: expected a JSON part, got {len(part)} bytes starting {part[:32]!r}") from None
        if not isinstance(value, dict):
            raise ValueError(f"{self.where}: expected a JSON object, got {part[:64]!r}")
        return value


def series_frames(config: dict, where: str) -> int:
    """Frames of the series: one per trigger in the modes exte and inte, nimages a trigger in exts and ints."""
    try:
        mode, ntrigger, nimages = config["trigger_mode"], int(config["ntrigger"]), int(config["nimages"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{where}: the detector configuration lacks trigger_mode, ntrigger or nimages") from None
    return ntrigger if mode in ("exte", "inte") else ntrigger * nimages


def detector_shape(config: dict, where: str) -> tuple[int, int]:
    """(rows, cols) of the detector configuration's frames."""
    try:
        return int(config["y_pixels_in_detector"]), int(config["x_pixels_in_detector"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{where}: the detector configuration lacks x_pixels_in_detector or y_pixels_in_detector") from None


def gathered(blobs: list[bytes], frame_bytes: int, buffer) -> Chunks:
    """``blobs`` back to back in ``buffer(nbytes)`` as Chunks; a 12-byte header of zeros filled in with the frame's
    size and DECTRIS's block size."""
    ends = np.cumsum([len(b) for b in blobs])
    starts = ends - [len(b) for b in blobs]
    data = buffer(int(ends[-1]))
    for blob, start in zip(blobs, starts):
        data[start : start + len(blob)] = np.frombuffer(blob, np.uint8)
        if len(blob) >= HEADER_BYTES and not data[start : start + HEADER_BYTES].any():
            data[start : start + HEADER_BYTES] = np.frombuffer(frame_bytes.to_bytes(8, "big") + BLOCK_BYTES.to_bytes(4, "big"), np.uint8)
    return Chunks(data, starts.astype(np.int64), ends.astype(np.int64))


def unpacked(blobs: list[bytes], encoding: str, det_shape: tuple[int, int], dtype: np.dtype, buffer, first: int, where: str) -> np.ndarray:
    """Frames of blobs not bitshuffled (``lz4<``: one LZ4 block; stream2's "lz4": the HDF5 LZ4 filter's
    blocks; "raw": the pixels), decoded into ``buffer``; ValueError naming the first that is malformed."""
    frame_bytes = det_shape[0] * det_shape[1] * dtype.itemsize
    data = buffer(len(blobs) * frame_bytes + WILD)
    for k, blob in enumerate(blobs):
        out = data[k * frame_bytes : (k + 1) * frame_bytes + WILD]
        if encoding == LZ4:
            code, a, b, c = lz4_block(np.frombuffer(blob, np.uint8), out, frame_bytes)
            problem = None if code == OK else message(code, 0, a, b, c)
        elif encoding == RAW:
            problem = None if len(blob) == frame_bytes else f"{len(blob)} bytes of pixels, a frame is {frame_bytes}"
            out[: len(blob) if problem is None else 0] = np.frombuffer(blob, np.uint8)
        else:
            problem = stream2.lz4_frame(blob, frame_bytes, out)
        if problem is not None:
            raise ValueError(f"{where} sent a malformed frame {first + k}: {problem}")
    return data[: len(blobs) * frame_bytes].view(dtype.newbyteorder("<")).reshape(len(blobs), *det_shape).astype(dtype, copy=False)


def image2(parts: "Parts", series, frame: int, channel: str | None, det_shape: tuple[int, int], dtype: np.dtype, where: str) -> tuple[str, bytes]:
    """The next stream2 image's encoding ("bslz4", "lz4" or "raw") and bytes, its message checked."""
    image = stream2.decoded(parts.next(), where)
    if image["type"] != "image":
        raise ValueError(f"{where}: expected frame {frame}, got a {image['type']!r} message (the series ended early?)")
    if image.get("series_id") != series or image.get("image_id") != frame:
        raise ValueError(f"{where}: frame {frame} came as image {image.get('image_id')} of series {image.get('series_id')}"
                         f" (series {series} expected: an image was lost, or another series began)")
    data = image.get("data") or {}
    if not isinstance(data, dict):
        raise ValueError(f"{where}: frame {frame}'s data is {type(data).__name__}, not a map of channels")
    array = data.get(channel) if channel is not None else next(iter(data.values()), None)
    if not isinstance(array, stream2.MultiDim) or not isinstance(array.array, stream2.Typed):
        raise ValueError(f"{where}: frame {frame} has no typed array for channel {channel!r} (channels: {sorted(map(str, data))})")
    typed = array.array
    if tuple(array.dims) != det_shape:
        raise ValueError(f"{where}: frame {frame} is {array.dims}, the acquisition holds {det_shape}")
    if typed.dtype.kind != "u" or typed.dtype.itemsize != dtype.itemsize or typed.dtype.byteorder == ">":
        raise ValueError(f"{where}: frame {frame} holds {typed.dtype.str} pixels; the acquisition holds {dtype} (little-endian)")
    content = typed.content
    if isinstance(content, bytes):
        return RAW, content
    if content.algorithm == BSLZ4 and content.element == dtype.itemsize:
        return BSLZ4, content.data
    if content.algorithm == "lz4":
        return "lz4", content.data
    raise ValueError(f"{where}: frame {frame} is compressed {content.algorithm!r} of elements of {content.element} bytes"
                     f" (readable: 'bslz4' of the pixels' {dtype.itemsize}, 'lz4')")
