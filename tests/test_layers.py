"""The import layers of qgpu_dask, checked from the source with ``ast`` (the package is never imported).

Every import counts: module level, inside functions (lazy), under ``if TYPE_CHECKING:`` and
``importlib.import_module("a literal")``. An import goes to the module it resolves to: ``from ..resident import
DenseCounts`` is an import of ``qgpu_dask/resident/dense.py`` (read from ``resident/__init__.py``). A module may
import only from its own layer or lower ones, never through the package face ``qgpu_dask/__init__.py``, and the
modules may not import in a circle. ``if TYPE_CHECKING:`` imports obey the layers but are left out of the circle
check: they never run, and a type named both ways within one layer is what they are for.

Every module is also held to a size (``MAX_LINES``, or its own cap in ``OVER_CAP``).
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FACE = "qgpu_dask"
# Top to bottom: a module imports from its own layer or lower ones only; the face is above them all.
LAYERS = ["cli", "view", "service", "ptycho", "queries", "phase", "detector", "io", "resident", "formats", "device"]
# The first name under qgpu_dask/ (module or package) -> its layer.
LAYER_OF = {
    "cli": "cli",
    "figure": "formats",  # labelled figures (the demo's, the viewer's saved phase): imports nothing of the package
    "view": "view",
    "service": "service",
    "ptycho": "ptycho",
    "queries": "queries",
    "phase": "phase",
    "samples": "phase",  # writes the sample files from io's crystal and phase's simulations; only the face
    # imports it: the lowest layer its imports allow, so it cannot come to lean on the service or the driver
    "detector": "detector",
    "io": "io",
    "resident": "resident",
    "formats": "formats",
    "device": "device",
    "compile": "device",
    "jit": "device",  # where Numba caches, what it compiles: imports nothing of the package
    "config": "device",  # the qgpu settings of dask.config: imports nothing of the package
}


# shared/design/ARCHITECTURE.md ("The core's shape"): no module over 400 lines. A module that long holds more than
# one concept (shard.py held six in 745 lines before it became service/shard/).
MAX_LINES = 400
# The modules over MAX_LINES when the cap came in (2026-12), each held to its size then: they may shrink, never
# grow. Split one below MAX_LINES, then drop it here.
OVER_CAP = {
    "qgpu_dask/resident/cpu/compressed.py": 1109,
    "qgpu_dask/service/service.py": 571,
    "qgpu_dask/service/handoff.py": 449,
    "qgpu_dask/resident/cuda/compressed.py": 518,
    "qgpu_dask/formats/bitshuffle_lz4.py": 489,
    "qgpu_dask/samples.py": 475,
    "qgpu_dask/resident/live.py": 426,
}


def find_modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under root/qgpu_dask; a package is its __init__.py, or its folder
    where it has none (a namespace package)."""
    modules = {}
    for path in sorted((root / FACE).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        for depth in range(2, len(parts)):
            modules.setdefault(".".join(parts[:depth]), root.joinpath(*parts[:depth]))
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def layer(module: str) -> str:
    """The layer of a dotted module name ("face" for the package face, "?" where the table lacks it)."""
    parts = module.split(".")
    return "face" if len(parts) == 1 else LAYER_OF.get(parts[1], "?")


def rank(layer_name: str) -> int:
    return -1 if layer_name == "face" else LAYERS.index(layer_name)


def raw_imports(path: Path, module: str) -> list[tuple[int, str, str | None, str | None, bool]]:
    """(line, absolute module, imported name or None, its local name, under TYPE_CHECKING) for each import in a
    file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def absolute(level: int, name: str | None) -> str:
        base = package.split(".")[: len(package.split(".")) - level + 1] if level else []
        return ".".join(base + ([name] if name else []))

    found = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, typing_only)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, None, None, typing_only) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = absolute(node.level, node.module)
            found.extend((node.lineno, source, alias.name, alias.asname or alias.name, typing_only)
                         for alias in node.names)
        elif (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            name = node.args[0].value
            dots = len(name) - len(name.lstrip("."))
            found.append((node.lineno, absolute(dots, name[dots:] or None) if dots else name, None, None, typing_only))
        for child in ast.iter_child_nodes(node):
            visit(child, typing_only)

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def resolve(modules: dict[str, Path], module: str, name: str | None) -> str:
    """The module that ``from module import name`` (or ``import module``) reaches: a submodule, or the module a
    package's __init__.py re-exports the name from, else the module itself."""
    if name and f"{module}.{name}" in modules:
        return f"{module}.{name}"
    init = modules[module]
    if name and init.name == "__init__.py":
        for _, source, imported, local, _ in raw_imports(init, module):
            if local == name and source in modules and (source, imported) != (module, name):
                return resolve(modules, source, imported)
    return module


def check(root: Path) -> tuple[list[str], dict[str, set[str]]]:
    """The layer errors of the tree under root, and its import graph (module -> the modules it imports,
    TYPE_CHECKING imports left out)."""
    modules = find_modules(root)
    errors = [f"qgpu_dask/{top} is in no layer: add it to LAYER_OF in tests/test_layers.py"
              for top in sorted({m.split(".")[1] for m in modules if "." in m} - set(LAYER_OF))]
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        if path.suffix != ".py":
            continue
        where = path.relative_to(root).as_posix()
        for line, source, name, _, typing_only in raw_imports(path, module):
            if source.split(".")[0] != FACE:
                continue
            if source not in modules:
                errors.append(f"{where}:{line} imports {source}, which does not exist")
                continue
            target = resolve(modules, source, name)
            if module != FACE and target == FACE:
                what = f"{name!r} from the package face" if name else f"{FACE} itself"
                errors.append(f"{where}:{line} imports {what} (import the module that defines it)")
                continue
            if module != FACE and source == FACE and f"{FACE}.{name}" not in modules:
                errors.append(f"{where}:{line} imports {target} through the package face (import {target})")
            above, below = layer(target), layer(module)
            if "?" not in (above, below) and rank(above) < rank(below):
                errors.append(f"{where}:{line} imports {target} (layer {above} above {below})")
            if not typing_only and target != module:
                graph[module].add(target)
    return list(dict.fromkeys(errors)), graph


def circles(graph: dict[str, set[str]]) -> list[str]:
    """Every module's shortest import circle back to itself, each written once as ``a -> b -> c -> a``."""
    found = {}
    for start in sorted(graph):
        came_from = {start: None}
        queue = deque([start])
        while queue:
            node = queue.popleft()
            for target in sorted(graph[node]):
                if target == start:
                    path = [node]
                    while came_from[path[-1]] is not None:
                        path.append(came_from[path[-1]])
                    cycle = path[::-1]
                    first = cycle.index(min(cycle))
                    cycle = cycle[first:] + cycle[:first]
                    found.setdefault(tuple(cycle), " -> ".join(cycle + cycle[:1]))
                    queue.clear()
                    break
                if target not in came_from:
                    came_from[target] = node
                    queue.append(target)
    return [f"import circle: {text}" for _, text in sorted(found.items())]


def failures(root: Path) -> list[str]:
    errors, graph = check(root)
    return errors + circles(graph)


def test_layers_and_circles():
    problems = failures(ROOT)
    assert not problems, f"{len(problems)} import(s) against the layers:\n" + "\n".join(problems)


def oversized(root: Path) -> list[str]:
    """Each Python module under root/qgpu_dask longer than its cap, and each OVER_CAP entry with nothing to hold
    (its module gone, or within MAX_LINES now)."""
    sizes = {path.relative_to(root).as_posix(): len(path.read_text().splitlines()) for path in (root / FACE).rglob("*.py")}
    found = [f"{where} has {lines} lines, over its cap of {OVER_CAP.get(where, MAX_LINES)}: split it by concept"
             for where, lines in sorted(sizes.items()) if lines > OVER_CAP.get(where, MAX_LINES)]
    found += [f"OVER_CAP lists {where}, which is {'gone' if where not in sizes else f'within {MAX_LINES} lines'}: drop it there"
              for where in OVER_CAP if sizes.get(where, 0) <= MAX_LINES]
    return found


def test_module_sizes():
    """No module of the package over MAX_LINES (kernels' CUDA sources and the viewer's script are not Python and
    not held), the ones over it when the cap came in held to their size then (``OVER_CAP``)."""
    problems = oversized(ROOT)
    assert not problems, "\n".join(problems)


def test_size_check_catches_each_kind(tmp_path):
    long = "x = 1\n" * (MAX_LINES + 1)
    for name, text in {"long.py": long, "fine.py": "x = 1\n", "samples.py": "x = 1\n"}.items():
        (tmp_path / FACE / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / FACE / name).write_text(text)
    found = oversized(tmp_path)
    assert found[0] == f"qgpu_dask/long.py has {MAX_LINES + 1} lines, over its cap of {MAX_LINES}: split it by concept"
    assert f"OVER_CAP lists qgpu_dask/samples.py, which is within {MAX_LINES} lines: drop it there" in found
    assert "OVER_CAP lists qgpu_dask/service/service.py, which is gone: drop it there" in found
    assert len(found) == 1 + len(OVER_CAP)


def test_checker_catches_each_kind(tmp_path):
    sources = {
        "__init__.py": "from .detector import masks\nfrom .resident import Dense\n",
        "cli.py": "from . import masks\nfrom . import device\n",
        "device.py": "",
        "detector/__init__.py": "from . import masks\n",
        "detector/masks.py": "from ..resident import Dense\n",
        "resident/__init__.py": "from .dense import Dense\n",
        "resident/dense.py": "class Dense: ...\n",
        "io/reader.py": "import importlib\nfrom ..service.shard import Shard\n"
                        "def load():\n    return importlib.import_module('qgpu_dask.phase.fit')\n",
        "phase/fit.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..io.reader import load\n"
                        "def fit():\n    from ..ptycho.driver import run\n",
        "ptycho/driver.py": "from .. import Dense\ndef run(): ...\n",
        "service/shard.py": "import qgpu_dask as qd\nfrom .a import x\n",
        "service/a.py": "from .b import x\n",
        "service/b.py": "from .shard import Shard\n",
        "extra/thing.py": "",
    }
    for name, text in sources.items():
        (tmp_path / FACE / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / FACE / name).write_text(text)
    assert sorted(failures(tmp_path)) == sorted([
        "qgpu_dask/extra is in no layer: add it to LAYER_OF in tests/test_layers.py",
        "qgpu_dask/cli.py:1 imports qgpu_dask.detector.masks through the package face (import qgpu_dask.detector.masks)",
        "qgpu_dask/io/reader.py:2 imports qgpu_dask.service.shard (layer service above io)",
        "qgpu_dask/io/reader.py:4 imports qgpu_dask.phase.fit (layer phase above io)",
        "qgpu_dask/phase/fit.py:5 imports qgpu_dask.ptycho.driver (layer ptycho above phase)",
        "qgpu_dask/ptycho/driver.py:1 imports qgpu_dask.resident.dense through the package face (import qgpu_dask.resident.dense)",
        "qgpu_dask/service/shard.py:1 imports qgpu_dask itself (import the module that defines it)",
        "import circle: qgpu_dask.service.a -> qgpu_dask.service.b -> qgpu_dask.service.shard -> qgpu_dask.service.a",
    ])
