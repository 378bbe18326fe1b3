"""Whether starting local worker processes would run the user's script again.

Dask starts a local cluster's worker processes with multiprocessing's spawn (or
forkserver) method, and each new process imports the main script again. A
script that starts the cluster at its top level, not under
``if __name__ == "__main__":``, would start it once more in every worker,
which multiprocessing refuses (the nannies fail to start, with hundreds of
lines of tracebacks); this finds that case before any process is started.
"""

from __future__ import annotations

import ast
import sys
from types import FrameType

import dask

GUARD_HINT = 'put the code that starts it under  if __name__ == "__main__":  (see the README\'s "Use")'


def is_main_test(test: ast.expr) -> bool:
    """Whether an ``if`` test is ``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    values = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and values == ["__main__"]


def guarded(path: str, line: int) -> bool:
    """Whether ``line`` of the script at ``path`` lies in a top-level ``if __name__ == "__main__":`` block
    (True where the script cannot be read: nothing is refused on a guess)."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return True
    return any(isinstance(node, ast.If) and is_main_test(node.test) and node.lineno <= line <= (node.end_lineno or line)
               for node in tree.body)


def script_frame(frame: FrameType | None) -> FrameType | None:
    """The frame of the main script's top-level code among ``frame`` and its callers, if there is one."""
    main = sys.modules.get("__main__")
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is getattr(main, "__dict__", None):
            return frame
        frame = frame.f_back
    return None


def reimports_main() -> bool:
    """Whether a new worker process imports the main script again: spawn or forkserver, and a main module
    that is a file (not a notebook, ``python -c`` or a package's ``__main__``)."""
    if dask.config.get("distributed.worker.multiprocessing-method", "spawn") not in ("spawn", "forkserver"):
        return False
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        return name != "__main__" and not name.endswith(".__main__")
    return getattr(main, "__file__", None) is not None


def check_main_guard(what: str, frame: FrameType | None) -> None:
    """RuntimeError, before any process starts, if ``what`` is started from a main script's top level
    outside ``if __name__ == "__main__":``."""
    if not reimports_main():
        return
    found = script_frame(frame)
    if found is not None and not guarded(found.f_code.co_filename, found.f_lineno):
        raise RuntimeError(
            f"{what} starts worker processes, and each of them runs the main script {found.f_code.co_filename!r} again "
            f"(line {found.f_lineno} would start another cluster there): {GUARD_HINT}"
        )
