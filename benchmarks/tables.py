"""Write the figures of the docs from benchmarks/results/*.json, so that none is typed by hand or goes stale unseen.

Each table (and each inline figure) sits in its page between marker comments,
``<!-- table: NAME -->`` ... ``<!-- end table -->`` (``<!-- figure: NAME -->``
... ``<!-- end figure -->`` inside a sentence), and states the commit and date
of its figures. ``MEASURES`` below names the package paths each benchmark
measures; a table whose figures are older than the latest
commit touching those paths says so, as do figures measured on a tree with
uncommitted changes or at an unknown commit. The prose around the markers is
written by hand.

    python benchmarks/tables.py           # rewrite the docs' tables
    python benchmarks/tables.py --check   # exit 1, naming each table that differs from its results
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
UNAVAILABLE = "history unavailable"


@dataclass(frozen=True)
class F:
    """One figure of a results JSON: its path below ``results`` ("a/b/c"), a format, bold or not."""

    path: str
    fmt: str = ""  # "": integers as they are, other numbers with 2 decimals
    bold: bool = False
    scale: float = 1.0
    absent: str = ""  # the cell where a run may leave the figure out (a part it was told to skip); else an error

    def text(self, results: dict) -> str:
        try:
            value = lookup(results, self.path)
        except KeyError:
            if self.absent:
                return self.absent
            raise
        if self.scale != 1.0:
            value = value * self.scale
        out = (self.fmt or ("{}" if isinstance(value, (int, bool, str)) or value is None else "{:.2f}")).format(value)
        return f"**{out}**" if self.bold else out


@dataclass(frozen=True)
class RatioOf:
    """The ratio of two figures of one results JSON (``path`` over ``over``)."""

    path: str
    over: str
    fmt: str = "{:.2f}"
    scale: float = 1.0

    def text(self, results: dict) -> str:
        return self.fmt.format(lookup(results, self.path) / lookup(results, self.over) * self.scale)


NOT_RUN = "not run in this record (`--rehome 0`)"
FIRST_CALLS = (("the demo's load (a series of 2, compressed)", "demo_load"), ("an Arina master (18 MB of counts)", "arina_load"),
               ("first compressed `frame()`", "frame"), ("`fit_aberrations`", "fit_aberrations"), ("`direct_ptycho`", "direct_ptycho"))


def first_calls_rows() -> tuple:
    """benchmarks/first_calls.py's calls: first with an empty and a filled cache, warm, and the first against warm."""
    rows = []
    for label, call in FIRST_CALLS:
        against = ((F("filled/demo_load_first_over_warm", "{:.2f}", bold=True), " x") if call == "demo_load"
                   else (F(f"filled/{call}_first_minus_warm_s", "{:+.2f}", bold=True), " s"))
        target = (F("targets/demo_load_first_over_warm_max", "{:.0f}"), " x") if call == "demo_load" else (F("targets/first_minus_warm_s_max", "{:+.0f}"), " s")
        rows.append((label, F(f"runs/empty_cache/first_s/{call}", "{:.2f}", absent="—"), F(f"runs/filled_cache/first_s/{call}", "{:.2f}"),
                     F(f"runs/filled_cache/warm_s/{call}", "{:.2f}"), against, target))
    rows.append(("starting the cluster (`qd.Service.local()`)", F("runs/empty_cache/cluster_start_s", "{:.2f}", absent="—"),
                 F("runs/filled_cache/cluster_start_s", "{:.2f}"), "", "", ""))
    rows.append(("`import qgpu_dask`", F("runs/empty_cache/import_s", "{:.2f}", absent="—"), F("runs/filled_cache/import_s", "{:.2f}"), "", "", ""))
    return tuple(rows)
Cell = str | F | RatioOf | tuple  # a tuple joins its parts: ("(", F(...), ")")


@dataclass(frozen=True)
class Table:
    """A markdown table of one results file: ``header`` cells and ``rows`` of cells."""

    name: str
    page: str
    result: str
    benchmark: str
    header: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]


@dataclass(frozen=True)
class Figure:
    """An inline figure of one results file: its cells joined, then the commit."""

    name: str
    page: str
    result: str
    benchmark: str
    parts: tuple[Cell, ...]


def lookup(results: dict, path: str):
    """The value at ``path`` ("a/b/c") below a results dict; a clear error naming the missing key."""
    value = results
    for key in path.split("/"):
        if isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        elif isinstance(value, dict) and key in value:
            value = value[key]
        else:
            raise KeyError(f"results field {path!r} is missing (at {key!r}): rerun the benchmark or fix the table in benchmarks/tables.py")
    return value


def fields(cells) -> list[str]:
    """Every results path a row, table or figure reads (not those a run may leave out: ``F.absent``)."""
    out = []
    for cell in cells:
        if isinstance(cell, F):
            out += [] if cell.absent else [cell.path]
        elif isinstance(cell, RatioOf):
            out.extend((cell.path, cell.over))
        elif isinstance(cell, tuple):
            out.extend(fields(cell))
    return out


def text(cell: Cell, results: dict) -> str:
    if isinstance(cell, (F, RatioOf)):
        return cell.text(results)
    if isinstance(cell, tuple):
        return "".join(text(c, results) for c in cell)
    return cell


def git(*args: str) -> str | None:
    """Output of a git command in the repository, or None when it fails (no git, no history, unknown commit)."""
    try:
        run = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return run.stdout.strip() if run.returncode == 0 else None


DENSE = ["qgpu_dask/resident/dense.py", "qgpu_dask/resident/cpu/dense.py", "qgpu_dask/resident/cuda/dense.py", "kernels/dense.cu",
         "qgpu_dask/resident/masks.py"]
COMPRESSED = ["qgpu_dask/resident/compressed.py", "qgpu_dask/resident/cpu/compressed.py", "qgpu_dask/resident/cuda/compressed.py",
              "kernels/compressed.cu", "qgpu_dask/formats/codec.py", "qgpu_dask/formats/groups.py"]
BITSHUFFLE = ["qgpu_dask/formats/bitshuffle_lz4.py", "qgpu_dask/formats/bitshuffle_lz4_cuda.py", "kernels/bitshuffle_lz4.cu"]
SAVED = ["qgpu_dask/io/saved.py", "qgpu_dask/formats/container.py", "qgpu_dask/formats/sha256_cuda.py", "kernels/sha256.cu"]
SERVICE = ["qgpu_dask/service", "qgpu_dask/queries", "qgpu_dask/resident/base.py"]
LOADS = ["qgpu_dask/io/load.py", "qgpu_dask/io/readers/hdf5.py", "qgpu_dask/io/readers/npy.py", "qgpu_dask/resident/staging.py"]
SSB = ["qgpu_dask/phase/calibration.py", "qgpu_dask/phase/cpu.py", "qgpu_dask/phase/cuda.py", "qgpu_dask/phase/fit.py", "qgpu_dask/phase/optics.py",
       "qgpu_dask/phase/sideband.py", "kernels/ssb.cu"]

# The code each benchmark measures (package paths): a change to one after a result's commit marks its figures stale.
# The simulators and NumPy references the benchmarks use are not listed; tensor_rates measures the GPU's units alone.
MEASURES: dict[str, list[str]] = {
    "gpu_dense": ["qgpu_dask/resident/cuda/dense.py", "kernels/dense.cu"],
    "service_overhead": SERVICE + DENSE + LOADS,
    "compressed": COMPRESSED + ["qgpu_dask/resident/dense.py", "qgpu_dask/resident/masks.py"],
    "load_formats": ["qgpu_dask/io/readers", "qgpu_dask/io/load.py", "qgpu_dask/io/registry.py"],
    "run_udf": ["qgpu_dask/queries/udf.py", "qgpu_dask/queries/resident_dataset.py"] + SERVICE + DENSE + COMPRESSED,
    "load_arina": ["qgpu_dask/io/readers/arina.py", "qgpu_dask/io/readers/stored_chunks.py", "qgpu_dask/io/load.py", "qgpu_dask/resident/staging.py"]
    + BITSHUFFLE + COMPRESSED + SERVICE,
    "reliability": SERVICE + DENSE + COMPRESSED + LOADS,
    "first_calls": ["qgpu_dask/jit.py", "qgpu_dask/__init__.py", "qgpu_dask/phase/cpu.py", "qgpu_dask/phase/direct.py", "qgpu_dask/phase/fit.py",
                    "qgpu_dask/resident/cpu", "qgpu_dask/io/readers/arina.py"] + SERVICE + LOADS + COMPRESSED + BITSHUFFLE,
    "ssb_vs_ptychography40": SSB,
    "multi_gpu": SERVICE + DENSE + COMPRESSED + LOADS,
    "ssb_gpu": SSB + DENSE + COMPRESSED,
    "direct_gpu": SSB + ["qgpu_dask/phase/direct.py"],
    "ptycho_gpu": ["qgpu_dask/phase/iterative", "kernels/ptycho.cu", "qgpu_dask/resident/feed.py"] + COMPRESSED,
    "live_gpu": ["qgpu_dask/resident/live.py", "qgpu_dask/io/stream.py", "qgpu_dask/io/wire.py", "qgpu_dask/io/simulator.py",
                 "qgpu_dask/io/source.py", "qgpu_dask/io/registry.py", "qgpu_dask/io/readers/base.py", "qgpu_dask/cli.py"] + BITSHUFFLE + COMPRESSED + SERVICE,
    "live_detectors": ["qgpu_dask/resident/live.py", "qgpu_dask/io/detectors", "qgpu_dask/io/stream.py", "qgpu_dask/io/batches.py",
                       "qgpu_dask/formats/merlin.py", "qgpu_dask/formats/stream2.py"] + BITSHUFFLE + COMPRESSED + SERVICE,
    "tensor_rates": [],
    "view_gpu": ["qgpu_dask/view", "qgpu_dask/detector/masks.py"] + SERVICE + DENSE + COMPRESSED,
    "view_phase_gpu": ["qgpu_dask/view", "qgpu_dask/phase/direct.py", "qgpu_dask/phase/parallax.py"] + SSB + SERVICE + DENSE,
    "cpu_vs_libertem": SERVICE + DENSE + COMPRESSED + LOADS,
    "series_gpu": SERVICE + DENSE + COMPRESSED + SAVED,
    "load_series_gpu": ["qgpu_dask/io/readers/arina.py", "qgpu_dask/io/readers/stored_chunks.py"] + SAVED + BITSHUFFLE + LOADS + COMPRESSED + SERVICE,
}


@functools.cache
def freshness(commit: str, paths: tuple[str, ...]) -> str:
    """How the figures of ``commit`` stand against the code they measure: "" when current, else a note."""
    if commit in ("", "unknown"):
        return "commit unknown: these figures cannot be placed in the history"
    base = commit.removesuffix("+dirty")
    notes = [f"measured on a tree with uncommitted changes ({base[:7]}+dirty)"] if commit.endswith("+dirty") else []
    if not paths:
        return "; ".join(notes)
    full = git("rev-parse", "--verify", "--quiet", f"{base}^{{commit}}")
    latest = git("log", "-1", "--format=%H", "--", *paths)
    if full is None or not latest or git("rev-parse", "--is-shallow-repository") != "false":
        return "; ".join(notes + [UNAVAILABLE])
    if git("merge-base", "--is-ancestor", latest, full) is None:
        changed = [p for p in paths if git("log", "-1", "--format=%H", f"{full}..{latest}", "--", p)]
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        notes.append(f"stale: {', '.join(changed[:3])}{more} changed after these figures, last at {latest[:7]}")
    return "; ".join(notes)


def provenance(doc: dict, benchmark: str) -> tuple[str, str]:
    """("commit abc1234, 2026-11-29, NVIDIA H200", freshness note) of a results document: the GPU named where
    one measured it, as timings of different GPUs are not comparable."""
    commit = str(doc.get("commit") or "unknown")
    short = commit if commit == "unknown" else commit.removesuffix("+dirty")[:7] + ("+dirty" if commit.endswith("+dirty") else "")
    gpu = (doc.get("machine") or {}).get("gpu")
    made = f"commit {short}, {str(doc.get('date', 'date unknown'))[:10]}" + (f", {gpu}" if gpu else "")
    return made, freshness(commit, tuple(MEASURES[benchmark]))


def load(result: str) -> dict | None:
    """A results document, or None where its benchmark has not been run yet (no JSON committed)."""
    path = RESULTS / f"{result}.json"
    return json.loads(path.read_text()) if path.exists() else None


def render(item: Table | Figure) -> str:
    """The generated text between an item's markers: a table (first column left, the rest right) or a figure."""
    doc = load(item.result)
    if doc is None:
        missing = f"not measured yet (`benchmarks/results/{item.result}.json`: run `benchmarks/{item.benchmark}.py`)"
        return missing if isinstance(item, Figure) else f"\n{missing[0].upper()}{missing[1:]}.\n"
    made, note = provenance(doc, item.benchmark)
    results = doc["results"]
    if isinstance(item, Figure):  # in a sentence: the stale note short, docs/benchmarks.md names the paths
        note = re.sub(r"stale: .* changed after these figures, last at (\w+)", r"stale since \1", note)
        return "".join(text(c, results) for c in item.parts) + f" ({made}{'; ' + note if note else ''})"
    lines = ["", f"Figures: `benchmarks/results/{item.result}.json`, {made}.", f"Status: {note or 'current'}.", "",
             "| " + " | ".join(item.header) + " |", "|---|" + "---:|" * (len(item.header) - 1)]
    lines += ["| " + " | ".join(text(c, results) for c in row) + " |" for row in item.rows]
    return "\n".join(lines + [""])


def markers(item: Table | Figure) -> tuple[str, str]:
    kind = "table" if isinstance(item, Table) else "figure"
    return f"<!-- {kind}: {item.name} -->", f"<!-- end {kind} -->"


def span(page_text: str, item: Table | Figure) -> tuple[int, int]:
    """Where an item's generated text sits in its page (between its markers)."""
    start, end = markers(item)
    at = page_text.find(start)
    if at < 0:
        raise ValueError(f"{item.page} has no {start!r}: put the marker where the {item.name} figures belong")
    stop = page_text.find(end, at)
    if stop < 0:
        raise ValueError(f"{item.page}: {start!r} has no {end!r} after it")
    return at + len(start), stop


def without_status(s: str) -> str:
    """The text with its freshness notes left out (compared when the history they need is missing)."""
    s = re.sub(r"^Status: .*$", "Status:", s, flags=re.M)
    return re.sub(r"\((commit [^,;)]+, [^;)]+)(;[^)]*)?\)", r"(\1)", s)


def update(items, check: bool) -> list[str]:
    """Rewrite every item's page (or, with ``check``, only compare): the names of the items that differed."""
    differ = []
    pages: dict[str, str] = {}
    for item in items:
        page = pages.setdefault(item.page, (ROOT / item.page).read_text())
        lo, hi = span(page, item)
        new = render(item)
        old = page[lo:hi]
        same = old == new or (UNAVAILABLE in new and without_status(old) == without_status(new))
        if not same:
            differ.append(f"{item.page}: {item.name}")
            pages[item.page] = page[:lo] + new + page[hi:]
    if not check:
        for name, page in pages.items():
            if (ROOT / name).read_text() != page:
                (ROOT / name).write_text(page)
    return differ


PAGE = "docs/benchmarks.md"
CPU_PAGE = "docs/benchmarks-cpu.md"
GUIDE = "docs/user-guide.md"


def gpu_dense_rows() -> tuple:
    cases = [("full read (`read_sum`, the baseline)", "read_sum", "TBps", None),
             ("virtual image, disk mask", "mask_disk", "effective_TBps", "ratio_to_read"),
             ("virtual image, full-detector mask", "mask_full_detector", "effective_TBps", "ratio_to_read"),
             ("BF + ABF + ADF in one pass", "mask_three_masks", "effective_TBps", "ratio_to_read"),
             ("8 rings in one pass", "mask_eight_rings", "effective_TBps", "ratio_to_read"),
             ("scan-ROI sum, whole scan", "roi_sum_whole_scan", "TBps", None),
             ("scan-ROI max, whole scan", "roi_max_whole_scan", "TBps", None),
             ("CuPy gather + uint64 sum (disk)", "cupy_references/cupy_gather_uint64_sum_disk", None, None),
             ("CuPy `sum(axis=0, dtype=uint64)`", "cupy_references/cupy_sum_axis0_uint64", None, None)]
    rows = []
    for label, key, tbps, ratio in cases:
        rate = F(f"{key}/{tbps}") if tbps else RatioOf("bytes", f"{key}/median_ms", scale=1e-9)
        rows.append((label, F(f"{key}/median_ms"), rate, F(f"{key}/{ratio}") if ratio else RatioOf("read_sum/median_ms", f"{key}/median_ms")))
    return tuple(rows)


def service_rows() -> tuple:
    calls = [("no-op shard call (`ping`)", "noop_shard_call"), ("tiny frame (4x4x16x16 acquisition)", "tiny_frame"),
             ("tiny virtual image", "tiny_virtual_image"),
             ("baseline: the same actor through Dask's `Actor` and the scheduler proxy", "baseline_actor_via_scheduler_proxy"),
             ("baseline: `client.submit(int, 1).result()`", "baseline_client_submit")]
    return tuple((label, F(f"round_trip/{k}/p50_ms"), F(f"round_trip/{k}/p95_ms")) for label, k in calls)


def compressed_rows() -> tuple:
    rows = []
    for i in range(4):
        d = f"doses/{i}"
        vi = lambda name: (F(f"{d}/virtual_image/{name}/compressed_ms"), " (", F(f"{d}/virtual_image/{name}/over_read"), ")")  # noqa: E731
        rows.append((F(f"{d}/dose", "{:g}"), F(f"{d}/size/block", "{}"), F(f"{d}/size/nbytes", "{:.3f}", scale=1e-9),
                     F(f"{d}/size/bound_ratio", "{:.3f}"), F(f"{d}/size/raw_ratio", "{:.1f}"), F(f"{d}/encode/GBps", "{:.1f}"),
                     vi("disk"), vi("random30"), vi("random90"), F(f"{d}/virtual_image/disk/dense_ms"),
                     F(f"{d}/frame/compressed_ms"), F(f"{d}/read/ms")))
    return tuple(rows)


def arina_rows() -> tuple:
    return (("raw read of the files' bytes", F("raw_read/s", "{:.3f}"), (F("raw_read/counts_GBps", "{:.1f}"), " (", F("raw_read/file_GBps"), " GB/s of file bytes)"), ""),
            ("h5py + hdf5plugin, one thread", F("h5py_hdf5plugin_1_thread/s", "{:.3f}"), F("h5py_hdf5plugin_1_thread/GBps"), "1.00"),
            ("`ArinaReader` into host memory", F("arina_reader/s", "{:.3f}"), F("arina_reader/GBps"), (F("arina_reader/over_h5py", "{:.1f}"), " x")),
            ("`svc.load`, dense resident", F("service_load/dense/s", "{:.3f}"), F("service_load/dense/GBps", bold=True),
             (F("service_load/dense/over_h5py", "{:.1f}"), " x")),
            (("`svc.load`, default layout (", F("service_load/auto/layout"), ")"), F("service_load/auto/s", "{:.3f}"), F("service_load/auto/GBps"),
             (F("service_load/auto/over_h5py", "{:.2f}"), " x")))


def arina_cpu_rows() -> tuple:
    """The rows of arina_rows, then the compressed load against a dense load plus the encode of its counts
    measured alone (issue 24: a coded load no slower than that)."""
    return arina_rows() + (
        ("`svc.load`, compressed", F("service_load/compressed/s", "{:.3f}"), F("service_load/compressed/GBps"),
         (F("service_load/compressed/over_h5py", "{:.2f}"), " x")),
        ("the encode of the dense counts alone (in one process)", F("encode_alone/s", "{:.3f}"), "", ""),
        ("compressed load over a dense load plus that encode (issue 24: <= 1)", F("compressed_over_dense_plus_encode", "{:.2f}", bold=True),
         "", ""))


def arina_cuda_rows() -> tuple:
    """The rows of arina_rows and a last column: each reader's GB/s of counts over the raw read's GB/s of file
    bytes (the issue's target: >= 0.70)."""
    rates = ("h5py_hdf5plugin_1_thread/GBps", "arina_reader/GBps", "service_load/dense/GBps", "service_load/auto/GBps")
    rows = arina_rows()
    return (rows[0] + ("",),) + tuple(row + (RatioOf(rate, "raw_read/file_GBps"),) for row, rate in zip(rows[1:], rates))


def formats_rows() -> tuple:
    """A row a format: the file, our load, each peer's (where it reads the format) and our time against the faster."""
    names = (("mrc", "MRC (mrcfile's writer)"), ("dm", "DigitalMicrograph DM4"), ("ser", "TIA .ser"), ("blo", "NanoMegas .blo (8-bit)"),
             ("tvips", "TVIPS"), ("seq", "StreamPix .seq"), ("frms6", "PNDetector .frms6"), ("raw", "raw, described"),
             ("k2is", "Gatan K2 IS (12-bit packed)"))
    return tuple((label, F(f"formats/{key}/file_bytes", "{:.2f}", scale=1e-9), (F(f"formats/{key}/ours_s", "{:.3f}", bold=True), " (",
                  F(f"formats/{key}/GBps", "{:.1f}"), " GB/s)"), F(f"formats/{key}/peers/rosettasciio/s", "{:.3f}", absent="does not read it"),
                  F(f"formats/{key}/peers/libertem/s", "{:.3f}"), (F(f"formats/{key}/over_faster_peer", "{:.2f}", bold=True), " x"),
                  F(f"formats/{key}/counts_equal")) for key, label in names)


def udf_rows() -> tuple:
    """A row a UDF: LiberTEM's time on the file with each executor, ours on the resident (dense: as asked, and every
    UDF through LiberTEM's runner; compressed), LiberTEM's default and fastest over ours as asked and through the runner."""
    names = (("sum", "SumUDF"), ("sumsig", "SumSigUDF"), ("masks", "ApplyMasksUDF, 2 masks"), ("com", "CoMUDF"), ("user_peak", "a user's per-frame UDF"))
    return tuple((label, F(f"udfs/{key}/libertem_s/default", "{:.3f}"), F(f"udfs/{key}/libertem_s/threads", "{:.3f}"),
                  F(f"udfs/{key}/libertem_s/inline", "{:.3f}"), F(f"udfs/{key}/dense/s", "{:.4f}", bold=True), F(f"udfs/{key}/dense_runner/s", "{:.3f}"),
                  F(f"udfs/{key}/compressed/s", "{:.3f}"),
                  (F(f"udfs/{key}/dense/over_default", "{:.1f}", bold=True), " x / ", F(f"udfs/{key}/dense/over_fastest", "{:.1f}", bold=True), " x"),
                  (F(f"udfs/{key}/dense_runner/over_default", "{:.1f}"), " x / ", F(f"udfs/{key}/dense_runner/over_fastest", "{:.2f}"), " x"),
                  (F(f"udfs/{key}/dense/equal"), " / ", F(f"udfs/{key}/dense_runner/equal"), " / ", F(f"udfs/{key}/compressed/equal")))
                 for key, label in names)


def reliability_rows() -> tuple:
    runs = [("1 thread (baseline)", "unloaded"), ("8 threads", "under_load"), ("8 threads, 2 workers killed", "faults/queries")]
    return tuple((label, F(f"{k}/queries"), F(f"{k}/wrong"), F(f"{k}/errors"), F(f"{k}/queries_per_s", "{:.0f}"),
                  F(f"{k}/p50_ms", "{:.1f}"), F(f"{k}/p95_ms", "{:.1f}"), F(f"{k}/p99_ms", "{:.1f}"), F(f"{k}/over_1s"),
                  F(f"{k}/max_ms", "{:.0f}")) for label, k in runs)


def kill_rows() -> tuple:
    first = ("the first load (the baseline)", "", F("first_load/GBps"), "1.00", "", "")
    return (first,) + tuple((f"SIGKILL worker {i + 1}", F(f"{k}/seconds_to_rehomed"), F(f"{k}/rehome_GBps"), F(f"{k}/rehome_over_first_load"),
                  F(f"{k}/seconds_to_balanced", "{:.1f}"), F(f"{k}/lost")) for i, k in enumerate(("faults/kills/0", "faults/kills/1")))


def multi_rows() -> tuple:
    rows = []
    for rep, label in (("dense:6", "dense"), ("compressed:6", "compressed")):
        for g in ("1", "2"):
            k = f"representations/{rep}/{g}"
            rows.append((label, g, F(f"{k}/series_query_ms"), F(f"{k}/weak_scaling_efficiency", bold=g == "2"), F(f"{k}/single_query_ms"),
                         F(f"{k}/ping_p50_ms_per_shard/0"), F(f"{k}/load_GBps"), F(f"{k}/load_over_file_read"),
                         F(f"{k}/resident_bytes", "{:.1f}", scale=1e-9), F("file_read_GBps")))
    return tuple(rows)


def series_rows() -> tuple:
    """One row per dose: every figure per acquisition, in brackets over a baseline of the same run."""
    rows = []
    for i in range(2):
        d = f"doses/{i}"
        per = lambda name, over="over_dense_vi": (F(f"{d}/{name}/ms_per_acquisition", "{:.3f}", bold=True), " (", F(f"{d}/{name}/{over}"), ")")  # noqa: E731
        rows.append((F(f"{d}/dose", "{:g}"), F(f"{d}/size/nbytes", "{:.1f}", scale=1e-9), F(f"{d}/size/over_bound", "{:.3f}"),
                     (F(f"{d}/moving_disk/first_ms_per_acquisition", "{:.3f}"), " / ", *per("moving_disk")), per("new_bf"), per("new_adf"),
                     per("random30", "over_full_read"), (F(f"{d}/frame/p50_ms"), " / ", F(f"{d}/frame/p95_ms")),
                     F(f"{d}/transport/transport_ms_per_acquisition", "{:.3f}"), F(f"{d}/baselines/dense_vi_ms"), F(f"{d}/baselines/full_read_ms"),
                     F(f"{d}/load/ms_per_acquisition", "{:.0f}")))
    return tuple(rows)


TABLES: tuple[Table | Figure, ...] = (
    Table("gpu_dense", PAGE, "gpu_dense", "gpu_dense", ("case", "ms", "effective TB/s", "full-read time / case time"), gpu_dense_rows()),
    Table("service_overhead_cuda", PAGE, "service_overhead_cuda", "service_overhead", ("call", "p50 ms", "p95 ms"), service_rows()),
    Table("service_overhead_series_cuda", PAGE, "service_overhead_cuda", "service_overhead", ("what", "ms"), (
        ("series query, 1 shard", F("series/1_shards_ms")), ("series query, 2 shards (two worker processes on the one GPU)", F("series/2_shards_ms")),
        ("ratio 1 shard / 2 shards", F("series/ratio_1_over_2", bold=True)),
        ("one virtual image through the service", F("series/one_query/service_query_ms")),
        ("its mask kernel alone", F("series/one_query/mask_kernel_ms")), ("a full read of the acquisition", F("series/one_query/full_read_ms")))),
    Table("service_overhead_cpu", PAGE, "service_overhead_cpu", "service_overhead", ("what", "ms"), (
        ("no-op shard call (`ping`) through the local lane, p50", F("round_trip/noop_shard_call/p50_ms")),
        ("baseline: the same through Dask's comm, p50", F("round_trip/baseline_noop_through_dask_comm/p50_ms")),
        ("lane / Dask's comm", F("round_trip/lane_over_dask_comm/noop", bold=True)),
        ("a frame's `Shard.ask` through the lane, p50", F("round_trip/frame_ask/p50_ms")),
        ("baseline: the same through Dask's comm, p50", F("round_trip/baseline_frame_ask_through_dask_comm/p50_ms")),
        ("lane / Dask's comm", F("round_trip/lane_over_dask_comm/frame_ask", bold=True)),
        ("a tiny frame (`acq.frame`), p50", F("round_trip/tiny_frame/p50_ms")),
        ("tiny virtual image, p50", F("round_trip/tiny_virtual_image/p50_ms")),
        ("series query, 1 shard", F("series/1_shards_ms")), ("series query, 2 shards", F("series/2_shards_ms")),
        ("ratio 1 shard / 2 shards", F("series/ratio_1_over_2")))),
    Table("compressed_cuda", PAGE, "compressed_cuda", "compressed",
          ("dose", "block", "GB held", "bound", "raw / held", "encode GB/s", "disk ms", "random 30 % ms", "random 90 % ms", "dense disk ms", "frame ms", "full read ms"),
          compressed_rows()),
    Table("compressed_moving_cuda", PAGE, "compressed_cuda", "compressed", ("moving disk", "ms"), (
        ("per acquisition per step", F("moving_disk/ms_per_acquisition_per_step", bold=True)),
        ("the dense layout's virtual image, per acquisition", F("moving_disk/dense_ms_per_acquisition")),
        ("compressed / dense", F("moving_disk/over_dense")), ("the first, full step, per acquisition", F("moving_disk/first_step_ms_per_acquisition")))),
    Table("series_gpu", PAGE, "series_gpu", "series_gpu",
          ("dose", "GB held, all", "held / bound", "moving disk ms, first / rest (/ dense VI)", "new BF disk ms (/ dense VI)",
           "new ADF annulus ms (/ dense VI)", "random 30 % ms (/ full read)", "frame p50 / p95 ms", "reply transport ms", "dense VI ms",
           "full read ms", "load ms"), series_rows()),
    Table("series_gpu_two_shards", PAGE, "series_gpu", "series_gpu", ("two shards sharing the GPU (first dose)", "ms per acquisition", "over one shard"), (
        ("moving disk, median of the steps after the first", F("doses/0/two_shards/moving_disk/ms_per_acquisition", "{:.3f}"),
         F("doses/0/two_shards/moving_disk_over_one_shard", bold=True)),
        ("new BF disk", F("doses/0/two_shards/new_bf/ms_per_acquisition", "{:.3f}"), F("doses/0/two_shards/new_bf_over_one_shard", bold=True)),
        ("acquisitions per shard", (F("doses/0/two_shards/load/owners/0"), " / ", F("doses/0/two_shards/load/owners/1")), ""))),
    Table("load_series_gpu", PAGE, "load_series_gpu", "load_series_gpu", ("figure", "value", "target"), (
        ("series: s per acquisition", F("series/s_per_acquisition", "{:.3f}", bold=True), F("targets/series_s_per_acquisition_max")),
        ("series: GB/s of counts", F("series/GBps", "{:.1f}", bold=True), F("targets/series_GBps_min")),
        ("series: counts over held bytes", F("series/raw_over_held", "{:.1f}"), ""),
        ("layout held", F("layout"), ""),
        ("every checksum equal to h5py's", F("series/checksums_equal"), ""),
        ("acquisitions held on the shard; filled until one was refused (`--fill`)", (F("held/acquisitions", bold=True), "; filled: ",
                                                                                   F("held/filled")), F("targets/held_acquisitions_min")),
        ("cold start: first load minus a warm one, s", F("cold_start/cold_minus_warm_s", "{:.2f}", bold=True), F("targets/cold_minus_warm_s_max")),
        ("saved form reopened, GB/s of file", F("saved_reopen/GBps", "{:.2f}", bold=True), F("targets/saved_reopen_GBps_min")),
        ("a worker's acquisitions held again after SIGKILL, s", F("rehome/seconds_to_rehomed", "{:.2f}", bold=True, absent=NOT_RUN),
         F("targets/rehome_s_max")),
        ("  of them: acquisitions, where from, checksums equal",
         (F("rehome/acquisitions", absent="—"), ", ", F("rehome/restored_from/0", absent="—"), ", ", F("rehome/checksums_equal", absent="—")), ""),
        ("baseline: stored bytes read in 1 thread, GB/s of counts", F("baselines/raw_read_1_thread_GBps", "{:.1f}"), ""),
        ("baseline: stored bytes read on every core, GB/s of counts", F("baselines/raw_read_all_threads_GBps", "{:.1f}"), ""),
        ("baseline: h5py + hdf5plugin in 1 thread, GB/s of counts", F("baselines/h5py_hdf5plugin_1_thread_GBps", "{:.2f}"), ""))),
    Table("load_arina_cuda", PAGE, "load_arina_cuda", "load_arina",
          ("reader", "s", "GB/s of counts", "against h5py + hdf5plugin", "against the raw read's GB/s of file bytes"), arina_cuda_rows()),
    *(Table(f"load_formats_{kind}", PAGE, f"load_formats_{kind}", "load_formats",
            ("format", "file GB", "ours: svc.load, s", "RosettaSciIO, s", "LiberTEM, s", "ours against the faster", "every count equal"),
            formats_rows()) for kind in ("cpu", "cuda")),
    *(Table(f"run_udf_{kind}", PAGE, f"run_udf_{kind}", "run_udf",
            ("UDF", "LiberTEM Context(), s", "LiberTEM threads, s", "LiberTEM inline, s", "ours: qd.run_udf, dense, s", "ours, engine=False, s",
             "ours, compressed, s", "LiberTEM's default / fastest over ours", "the same, engine=False",
             "results equal (dense / engine=False / compressed)"), udf_rows()) for kind in ("cpu", "cuda")),
    Table("load_arina_cpu", PAGE, "load_arina_cpu", "load_arina", ("reader", "s", "GB/s of counts", "against h5py + hdf5plugin"),
          arina_cpu_rows()),
    Table("first_calls_cpu", PAGE, "first_calls_cpu", "first_calls",
          ("call", "first, empty cache, s", "first, cache filled, s", "warm, s", "first (filled) against warm", "target"),
          first_calls_rows()),
    Table("reliability_cuda", PAGE, "reliability_cuda", "reliability",
          ("run", "queries", "wrong", "errors", "queries/s", "p50 ms", "p95 ms", "p99 ms", "over 1 s", "max ms"), reliability_rows()),
    Table("reliability_kills_cuda", PAGE, "reliability_cuda", "reliability",
          ("fault injected", "re-homed in s", "GB/s of counts", "against the first load", "shard back with its share, s", "lost"), kill_rows()),
    Table("reliability_memory_cuda", PAGE, "reliability_cuda", "reliability", ("memory pressure", ""), (
        ("load larger than any shard's free budget refused in, ms", F("memory_pressure/refuse_s", "{:.0f}", scale=1e3)),
        ("the refusal", F("memory_pressure/message")),
        ("bytes reserved after the refusal", F("memory_pressure/reserved_after_refusal")),
        ("queries after it: wrong / errors / all", (F("memory_pressure/queries_after_refusal/wrong"), " / ",
                                                   F("memory_pressure/queries_after_refusal/errors"), " / ", F("memory_pressure/queries_after_refusal/queries"))),
        ("resident GB before / after releasing all", (F("memory_pressure/resident_bytes_before_release", "{:.3f}", scale=1e-9), " / ",
                                                     F("memory_pressure/resident_bytes_after_release", "{:.3f}", scale=1e-9))),
        ("device free memory gained, GB", F("memory_pressure/device_free_gained_bytes", "{:.2f}", scale=1e-9)))),
    Table("reliability_cpu", PAGE, "reliability_cpu", "reliability",
          ("run", "queries", "wrong", "errors", "queries/s", "p50 ms", "p95 ms", "p99 ms", "over 1 s", "max ms"), reliability_rows()),
    Table("reliability_kills_cpu", PAGE, "reliability_cpu", "reliability",
          ("fault injected", "re-homed in s", "GB/s of counts", "against the first load", "shard back with its share, s", "lost"), kill_rows()),
    Table("ssb_vs_ptychography40", PAGE, "ssb_vs_ptychography40_cpu", "ssb_vs_ptychography40",
          ("", "time s", "against their UDF", "correlation with the object"), (
              ("ptychography40 SSB_UDF, LiberTEM inline (its masks included)", F("ptychography40/udf_s"), "1.00", F("ptychography40/correlation_with_object", "{:.3f}")),
              ("their masks alone", F("ptychography40/masks_s"), "", ""),
              ("`acq.ssb`, first call (G prepared)", F("ours/first_ssb_s"), F("first_over_udf", "{:.3f}", bold=True), F("ours/correlation_with_object", "{:.3f}")),
              ("`acq.ssb` again, other aberrations (G kept)", F("ours/repeat_ssb_s"), F("repeat_over_udf", "{:.3f}", bold=True), ""),
              ("the two phases' correlation", "", "", F("phases_correlation", "{:.3f}")))),
    Table("multi_gpu", PAGE, "multi_gpu_cuda_x2_dense", "multi_gpu",
          ("6 acquisitions per GPU", "G", "series query ms", "efficiency", "one query ms", "ping ms, first shard", "load GB/s of counts", "load / file read", "GB resident", "file read GB/s"),
          multi_rows()[:2]),
    Table("multi_gpu_compressed", PAGE, "multi_gpu_cuda_x2_compressed", "multi_gpu",
          ("6 acquisitions per GPU", "G", "series query ms", "efficiency", "one query ms", "ping ms, first shard", "load GB/s of counts", "load / file read", "GB resident", "file read GB/s"),
          multi_rows()[2:]),
    Table("multi_gpu_kill", PAGE, "multi_gpu_cuda_x2_compressed", "multi_gpu", ("worker loss, compressed, G = 2", ""), (
        ("held again on GPU 0 after, s", F("representations/compressed:6/2/kill/seconds_to_rehomed", "{:.1f}", bold=True)),
        ("restarted worker had its share back after, s", F("representations/compressed:6/2/kill/seconds_to_balanced", "{:.1f}")),
        ("lost", F("representations/compressed:6/2/kill/lost")),
        ("series images exact after it", F("representations/compressed:6/2/kill/exact_after")))),
    Figure("multi_gpu_256", PAGE, "multi_gpu_cuda_x2_256", "multi_gpu", (F("runs/2/weak_scaling_efficiency"),)),
    Figure("multi_gpu_512", PAGE, "multi_gpu_cuda_x2_512", "multi_gpu", (F("runs/2/weak_scaling_efficiency"),)),
    Table("ssb_cuda", PAGE, "ssb_cuda", "ssb_gpu", ("step", "ms", "cold ms", "in reads of the counts"), (
        ("`calibrate` (mean pattern, 4 exact images, host search)", F("calibrate_ms", "{:.1f}"), F("calibrate_cold_ms", "{:.0f}"), ""),
        ("first `ssb` of an acquisition (G made and kept)", F("first_ssb_ms", "{:.1f}", bold=True), F("first_ssb_cold_ms", "{:.0f}"), F("first_ssb_over_one_read", "{:.1f}")),
        ("`ssb` after a change of C10 (G kept)", F("ssb_after_c10_change_ms", "{:.1f}", bold=True), "", F("repeat_over_one_read", "{:.1f}")),
        ("series of compressed copies in one call, first `ssb` each, per acquisition", F("series/per_acquisition_ms", "{:.0f}", bold=True), "", ""),
        ("stages on the owner: pixel images / rfft2 / G in all / sideband sum / inverse FFT",
         (F("stages/pixel_images_ms", "{:.1f}"), " / ", F("stages/rfft2_ms", "{:.1f}"), " / ", F("stages/prepare_ms", "{:.1f}"), " / ",
          F("stages/sideband_sum_ms", "{:.1f}"), " / ", F("stages/inverse_fft_ms", "{:.1f}")), "", ""),
        ("on the owner: the bright-field pixels / the whole phase from a kept G",
         (F("stages/bright_field_pixels_ms", "{:.1f}", absent="-"), " / ", F("stages/phase_ms", "{:.1f}", absent="-")), "", ""),
        ("one read of the counts", F("stages/read_counts_ms"), "", "1"),
        ("the first `ssb` / the sum of its stages", F("first_over_preparation_stages"), "", ""),
        ("the repeat / the fused sideband sum alone", F("repeat_over_sideband_sum"), "", ""),
        ("`calibrate`'s rotation, deg (truth 0)", F("calibration/rotation_deg", "{:.1f}"), "", ""),
        ("correlation of the phase with the object", F("correlation_with_object", "{:.3f}"), "", ""))),
    Table("ssb_fit_cuda", PAGE, "ssb_cuda_fit_rotation", "ssb_gpu", ("`fit_aberrations` with the rotation search (G kept)", ""), (
        ("ms", F("fit_aberrations_ms", "{:.0f}")), ("fitted rotation, deg", F("fitted/rotation_deg")), ("fitted C10, A", F("fitted/C10", "{:.1f}")),
        ("fitted C12, A", F("fitted/C12", "{:.1f}")), ("fitted phi12, rad", F("fitted/phi12")),
        ("correlation with the object after the fit", F("correlation_after_fit", "{:.3f}")))),
    Table("direct_cuda", PAGE, "direct_cuda", "direct_gpu", ("", "phase", "complex", "target (issue 7)"), (
        ("preparation from the client (G kept; equations built, one solve, image fetched), ms",
         F("phase/prepare_ms", "{:.1f}", bold=True), F("complex/prepare_ms", "{:.1f}", bold=True), "15 / 25"),
        ("of which, on the owner: the Gram kernels, ms", F("owner/phase/gram_kernels_ms", "{:.1f}"), F("owner/complex/gram_kernels_ms", "{:.1f}"), ""),
        ("of which, on the owner: all of `prepare`, ms", F("owner/phase/prepare_ms", "{:.1f}"), F("owner/complex/prepare_ms", "{:.1f}"), ""),
        ("strength only, from the client, ms", F("phase/strength_only_ms", "{:.1f}", bold=True), F("complex/strength_only_ms", "{:.1f}", bold=True), "2"),
        ("of which, on the owner: the batched solves, placement and inverse FFT, ms", F("owner/phase/solve_ms", "{:.1f}"), F("owner/complex/solve_ms", "{:.1f}"), ""),
        ("of which, on the owner: the image to the host, ms", F("owner/phase/image_to_host_ms", "{:.1f}"), F("owner/complex/image_to_host_ms", "{:.1f}"), ""),
        ("equations kept, MB", F("owner/phase/equations_bytes", "{:.0f}", scale=1e-6), F("owner/complex/equations_bytes", "{:.0f}", scale=1e-6), ""),
        ("Gram / right side against the float64 twin (relative to the largest entry)",
         (F("owner/phase/gram_relative_error", "{:.1e}"), " / ", F("owner/phase/rhs_relative_error", "{:.1e}")),
         (F("owner/complex/gram_relative_error", "{:.1e}"), " / ", F("owner/complex/rhs_relative_error", "{:.1e}")), "reported"),
        ("correlation with the object's band-limited phase", F("phase/correlation_with_object", "{:.3f}"), F("complex/correlation_with_object", "{:.3f}"), ""),
        ("baselines: `ssb` with G kept / a blank image's fetch / the alias geometry, ms",
         (F("ssb_ms", "{:.1f}"), " / ", F("image_fetch_ms", "{:.1f}"), " / ", F("owner/aliases_ms", "{:.1f}")), "", ""),
        ("cold (first call in the session), ms", F("phase_cold_ms", "{:.0f}"), F("complex_cold_ms", "{:.0f}"), ""))),
    Table("ptycho_feed_cuda", PAGE, "ptycho_cuda", "ptycho_gpu", ("resident, blocks of", "G counts/s", "against the read", "target (issue 8)"), (
        ("dense, counts (views)", F("feed_dense_counts/G_counts_per_s", "{:.0f}", bold=True), F("feed_dense_counts/over_read"), ">= 250"),
        ("dense, float32 amplitudes", F("feed_dense_amplitude/G_counts_per_s", "{:.0f}"), F("feed_dense_amplitude/over_read", "{:.3f}"), ""),
        ("compressed, counts, dose 0.5", F("feed_compressed_counts/G_counts_per_s", "{:.1f}"), F("feed_compressed_counts/over_read", "{:.3f}"), ">= 250"),
        ("compressed, amplitudes, dose 0.5 / 0.2 / 0.05",
         (F("feed_compressed_by_dose/0.5/G_counts_per_s", "{:.0f}"), " / ", F("feed_compressed_by_dose/0.2/G_counts_per_s", "{:.0f}"), " / ",
          F("feed_compressed_by_dose/0.05/G_counts_per_s", "{:.0f}", bold=True)), "", ""),
        ("the plain read of the dense counts, TB/s", F("read_GBps", "{:.1f}", scale=1e-3), "", ""),
        ("raw / held, compressed at dose 0.5", F("compressed_ratio", "{:.1f}"), "", ""))),
    Table("ptycho_pass_cuda", PAGE, "ptycho_cuda", "ptycho_gpu", ("", "ms per 262,144 positions"), (
        ("fed pass", F("iteration/ms_per_262144_positions", "{:.0f}", bold=True)),
        ("the update alone (blocks made beforehand)", F("iteration/update_alone_ms", "{:.0f}")),
        ("the feed alone (compressed counts)", F("iteration/feed_ms", "{:.0f}")),
        ("overlap, (feed + update - fed) / feed", F("iteration/overlap")),
        ("fed pass, the detector cropped to 2/3 in the feed (`crop`)", F("iteration/reduced/crop/ms_per_262144_positions", "{:.0f}", absent="not measured")),
        ("fed pass, the detector binned 2 x 2 in the feed (`bin=2`)", F("iteration/reduced/bin/ms_per_262144_positions", "{:.0f}", absent="not measured")))),
    Table("ptycho_stages_cuda", PAGE, "ptycho_cuda", "ptycho_gpu", ("one batch of 512 positions, each step timed alone", "us"), tuple(
        (label, F(f"stages_us_per_batch/{k}", "{:.0f}", absent="-")) for label, k in (
            ("exit waves", "exit_waves"), ("cuFFT 2-D forward", "fft2"), ("projection", "project"), ("cuFFT inverse", "ifft2"),
            ("probe sums", "probe_sums"), ("the far-field update (`updated_waves`, its default path)", "updated_waves"),
            ("the same by a pair of CTAs per position", "updated_waves_pair"), ("the object's gathered update", "object_update")))),
    Table("live_cuda", PAGE, "live_cuda", "live_gpu",
          ("stream", "wire, frames/s", "ingest alone", "ingest with viewer", "GB/s of counts", "viewer, queries/s", "against the Arina's 120,000"), (
              ("bitshuffle-LZ4 chunks", F("bitshuffle_lz4/wire_frames_per_s", "{:,.0f}"), F("bitshuffle_lz4/alone/frames_per_s", "{:,.0f}"),
               F("bitshuffle_lz4/with_viewer/frames_per_s", "{:,.0f}", bold=True), F("bitshuffle_lz4/with_viewer/GB_per_s"),
               (F("bitshuffle_lz4/with_viewer/views_per_s", "{:.1f}", bold=True), " (", F("bitshuffle_lz4/with_viewer/views_per_s_finished", "{:.0f}"), " finished)"),
               RatioOf("bitshuffle_lz4/with_viewer/frames_per_s", "arina_rate_frames_per_s")),
              ("over the wire", "", F("bitshuffle_lz4/alone/over_wire"), F("bitshuffle_lz4/with_viewer/over_wire"), "", "", ""),
              ("resident: raw / held", F("bitshuffle_lz4/with_viewer/ratio"), "", "", "", "", ""))),
    *(Table(f"live_detectors_{backend}", PAGE, f"live_detectors_{backend}", "live_detectors",
            ("frames/s", "the simulator's send rate", "LiberTEM-live's receiver", "ours: compressed (Timepix3: sparse)", "with a viewer",
             "ours: dense"), tuple(
                (f"{label}, {size}", F(f"{key}/simulator_frames_per_s", "{:,.0f}"), F(f"{key}/libertem_live_frames_per_s", "{:,.0f}"),
                 (F(f"{key}/alone/frames_per_s", "{:,.0f}", bold=True), " (", F(f"{key}/alone/over_libertem_live"), " x)"),
                 (F(f"{key}/with_viewer/frames_per_s", "{:,.0f}"), " (", F(f"{key}/with_viewer/over_libertem_live"), " x, ",
                  F(f"{key}/with_viewer/views_per_s", "{:.1f}"), " queries/s)"),
                 (F(f"{key}/dense/frames_per_s", "{:,.0f}", bold=True), " (", F(f"{key}/dense/over_libertem_live"), " x)")
                 if key != "timepix" else "not measured: 1 MiB a frame")
                for label, key, size in (("Merlin data port", "merlin", "256 x 256 U16"), ("DECTRIS stream v1", "dectris", "192 x 192 bs16-lz4"),
                                         ("ASI Timepix3", "timepix", "512 x 512 u32 sparse"))))
      for backend in ("cpu", "cuda")),
    *(Table(f"view_{backend}", PAGE, f"view_{backend}", "view_gpu",
            ("in headless chromium", "viewer", "the API alone, same run", "target"), (
                ("drag: images drawn per second", F("drag/updates_per_s", "{:.1f}", bold=True), (F("baseline/image_per_s", "{:.1f}"), " answers/s"),
                 F("targets/drag_updates_per_s_min", "{:.0f}")),
                ("drag to pixels, ms p50 / p95", (F("drag/latency_p50_ms", "{:.1f}", bold=True), " / ", F("drag/latency_p95_ms", "{:.1f}")), "",
                 (F("targets/latency_p50_ms_max", "{:.0f}"), " / ", F("targets/latency_p95_ms_max", "{:.0f}"))),
                ("grid of every acquisition: updates per second", F("grid/updates_per_s", "{:.1f}", bold=True),
                 (F("baseline/series_per_s", "{:.1f}"), " answers/s"), F("targets/grid_updates_per_s_min", "{:.0f}")),
                ("slider step to the next image painted, ms p50 (max)", (F("slider/step_p50_ms", "{:.1f}", bold=True), " (", F("slider/step_max_ms", "{:.1f}"), ")"),
                 "", F("targets/step_ms_max", "{:.0f}")),
                ("acquisitions; scan; detector", (F("acquisitions"), "; ", F("scan/0"), " x ", F("scan/1"), "; ", F("det"), " x ", F("det")), "", ""),
            )) for backend in ("cuda", "cpu")),
    *(Table(f"view_phase_{backend}", PAGE, f"view_phase_{backend}", "view_phase_gpu",
            ("slider step to its phase image, ms", "painted in the page, p50", "p95 / max",
             "read over the page's socket from Python, p50 (p95)", "the API alone, p50", "target p50"), tuple(
                (label, F(f"viewer/{key}/p50_ms", "{:.1f}", bold=True, absent="no browser"),
                 (F(f"viewer/{key}/p95_ms", "{:.1f}", absent="-"), " / ", F(f"viewer/{key}/max_ms", "{:.1f}", absent="-")),
                 (F(f"socket/{key}/p50_ms", "{:.1f}", bold=True), " (", F(f"socket/{key}/p95_ms", "{:.1f}"), ")"),
                 F(f"api/{key}/p50_ms", "{:.1f}") if key != "strength" else "",
                 F(f"targets/{key}_p50_ms", "{:.0f}") if backend == "cuda" or key in ("ssb", "direct-phase") else "")
                for label, key in (("SSB, C10 slider", "ssb"), ("direct, phase, C10 slider", "direct-phase"),
                                   ("direct, complex, C10 slider", "direct-complex"), ("direct, phase, strength slider", "strength")))
            + (("scan; detector; upsampling", (F("scan"), " x ", F("scan"), "; ", F("det"), " x ", F("det"), "; u = ", F("upsampling")), "", "", "", ""),))
      for backend in ("cuda", "cpu")),
    Table("tensor_rates_cuda", PAGE, "tensor_rates_cuda", "tensor_rates", ("unit", "TFLOPS", "against float32 multiply-adds"), tuple(
        (label, F(f"tflops/{k}", "{:.1f}"), F(f"over_f32_fma/{k}")) for label, k in (
            ("float64 tensor cores, m8n8k4", "f64_m8n8k4"), ("float64 tensor cores, m16n8k4", "f64_m16n8k4"),
            ("float64 tensor cores, m16n8k16", "f64_m16n8k16"), ("tf32 tensor cores, m16n8k8", "tf32_m16n8k8"), ("float32 multiply-adds", "f32_fma")))),
    Figure("guide_ssb", GUIDE, "ssb_cuda", "ssb_gpu", (
        F("first_ssb_ms", "{:.0f}"), " ms for the first `ssb` of an acquisition, ", F("ssb_after_c10_change_ms", "{:.0f}"),
        " ms after a change of C10; the first call in a worker also compiles the kernels, about ", F("first_ssb_cold_ms", "{:.1f}", scale=1e-3), " s")),
    Figure("guide_direct_strength", GUIDE, "direct_cuda", "direct_gpu", (
        "about ", F("owner/phase/solve_ms", "{:.0f}"), " ms on the GPU for a 512 x 512 scan at u = 3, and the fetch of the image: ",
        F("phase/strength_only_ms", "{:.0f}"), " ms from a notebook for the phase")),
    Figure("guide_direct_prepare", GUIDE, "direct_cuda", "direct_gpu", (
        F("phase/prepare_ms", "{:.0f}"), " ms (phase) and ", F("complex/prepare_ms", "{:.0f}"), " ms (complex)")),
    Figure("guide_ptycho", GUIDE, "ptycho_cuda", "ptycho_gpu", ("about ", F("iteration/ms_per_262144_positions", "{:.2f}", scale=1e-3), " s")),
    Figure("guide_live", GUIDE, "live_cuda", "live_gpu", (
        F("bitshuffle_lz4/with_viewer/frames_per_s", "{:,.0f}"), " frames/s of 192 x 192 uint16 (", F("bitshuffle_lz4/with_viewer/GB_per_s", "{:.1f}"),
        " GB/s of counts, ", RatioOf("bitshuffle_lz4/with_viewer/frames_per_s", "arina_rate_frames_per_s"), " x an Arina's 120,000)")),
    Figure("guide_live_viewer", GUIDE, "live_cuda", "live_gpu", (F("bitshuffle_lz4/with_viewer/views_per_s", "{:.0f}"), " queries/s")),
    Figure("readme_series", "README.md", "series_gpu", "series_gpu", (
        F("acquisitions"), " held on one GPU: a new bright-field disk over all of them in ", F("doses/0/new_bf/ms_per_acquisition", "{:.2f}"),
        " ms per acquisition at ", F("doses/0/dose", "{:.1f}"), " counts per pixel")),
    Figure("guide_frame", GUIDE, "series_gpu", "series_gpu", (
        F("doses/0/frame/p50_ms", "{:.2f}"), " ms p50 at ", F("doses/0/dose", "{:.1f}"), " counts per pixel (", F("doses/1/frame/p50_ms", "{:.2f}"),
        " ms at ", F("doses/1/dose", "{:.0f}"), ")")),
    *(Table(name, page, "cpu_vs_libertem", "cpu_vs_libertem",
            ("query", "LiberTEM ms (its fastest executor)", "default layout ms", "LiberTEM / default", "compressed ms", "LiberTEM / compressed"),
            tuple((label, (F(f"queries/{q}/libertem/median_s", "{:.1f}", scale=1e3), " (", F(f"queries/{q}/libertem/executor"), ")"),
                   F(f"queries/{q}/default/median_s", "{:.2f}", scale=1e3), F(f"queries/{q}/default/libertem_over", "{:.1f}x", bold=True),
                   F(f"queries/{q}/compressed/median_s", "{:.1f}", scale=1e3), F(f"queries/{q}/compressed/libertem_over", "{:.1f}x", bold=True))
                  for label, q in (("2-mask virtual image (BF disk + ADF annulus)", "virtual_image"), ("sum pattern", "sum_pattern"),
                                   ("centre of mass", "center_of_mass")))
            + ((("compressed series of ", F("series/files"), " files, one `series.virtual_images`"),
                (F("series/libertem/median_s", "{:.1f}", scale=1e3), " (", F("series/libertem/executor"), ", on each file)"), "", "",
                F("series/compressed/median_s", "{:.1f}", scale=1e3), F("series/libertem_over", "{:.1f}x", bold=True)),
               ("default layout", F("default_layout/layout"), F("default_layout/layout_reason"), "", "", ""),
               ("every target met (default >= 10x, compressed virtual image >= 1x, compressed series >= 2x); all results `==`",
                F("all_targets_met"), F("all_equal"), "", "", "")))
      for name, page in (("cpu_vs_libertem_summary", PAGE), ("cpu_vs_libertem_queries", CPU_PAGE))),
    Table("cpu_vs_libertem", CPU_PAGE, "cpu_vs_libertem", "cpu_vs_libertem", ("what", "median ms", "min ms", "GB/s"), tuple(
        (label, F(f"{k}/median_s", "{:.2f}" if bold or "/" in k and k.startswith("qgpu") else "{:.1f}", scale=1e3, bold=bold),
         F(f"{k}/min_s", "{:.2f}" if k.startswith("qgpu") else "{:.1f}", scale=1e3), F(f"{k}/gb_per_s")) for label, k, bold in (
            ("LiberTEM `inline` (InlineJobExecutor)", "libertem/inline", False),
            ("LiberTEM `threads:2` (ConcurrentJobExecutor)", "libertem/threads:2", False),
            ("LiberTEM default `Context()` (DaskJobExecutor, 2 workers)", "libertem/default", False),
            ("LiberTEM `dask:2` (DaskJobExecutor)", "libertem/dask:2", False),
            ("NumPy: h5py read + `tensordot`", "numpy", False),
            ("**qgpu-dask query (default layout), 1 worker**", "qgpu/1", True),
            ("qgpu-dask query (default layout), 2 workers", "qgpu/2", False)))),
    Table("cpu_vs_libertem_more", CPU_PAGE, "cpu_vs_libertem", "cpu_vs_libertem", ("same run", ""), (
        ("LiberTEM (fastest) / qgpu-dask (faster of 1 and 2 workers), virtual image", F("ratios/libertem_over_qgpu", "{:.1f}x", bold=True)),
        ("NumPy / qgpu-dask (1 worker)", F("ratios/numpy_over_qgpu", "{:.1f}x")),
        ("qgpu-dask load (once, read by the worker), s", F("qgpu/1/load_s")),
        ("qgpu-dask load, GB/s", F("qgpu/1/load_gb_per_s")),
        ("the Numba kernel on the worker, ms", F("qgpu/1/kernel_median_s", "{:.1f}", scale=1e3)),
        ("a `ping` round trip, ms", F("qgpu/1/ping_median_s", "{:.2f}", scale=1e3)),
        ("the kernel in the client process, 2 threads / 1 thread, ms", (F("mask_sums_in_process/by_threads_median_s/2", "{:.1f}", scale=1e3), " / ",
                                                                        F("mask_sums_in_process/by_threads_median_s/1", "{:.1f}", scale=1e3))))),
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare: exit 1 naming each table that differs from its results")
    args = ap.parse_args()
    try:
        differ = update(TABLES, args.check)
    except (KeyError, FileNotFoundError, ValueError) as err:
        print(f"benchmarks/tables.py: {err}", file=sys.stderr)
        return 2
    if args.check and differ:
        print("these tables differ from what benchmarks/results/*.json give (run python benchmarks/tables.py):\n  "
              + "\n  ".join(differ), file=sys.stderr)
        return 1
    for name in differ:
        print(f"rewrote {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
