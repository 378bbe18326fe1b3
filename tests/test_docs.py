"""The README's and the user guide's code blocks run as written, so the docs cannot drift from the code.

Each document's ``python`` blocks run in order in one namespace, in a fresh folder (the guide's first
block writes the sample files it loads: ``qd.samples.write(".")``), on a real local cluster of worker
processes. A statement followed by a comment ``# SomeError: message`` must raise that error with that
message (``...`` in it stands for any text). The ``bash`` blocks hold ``qgpu-dask`` commands: each is
parsed by the command's own argument parser, and ``qgpu-dask info`` is run against the guide's cluster.
``text`` blocks are output, not code. Blocks of any other kind are refused, so none escapes the test.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from qgpu_dask import cli

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ["README.md", "docs/user-guide.md"]
RUN = {"python", "bash"}
SHOWN = {"text"}
FENCE = re.compile(r"^```(\w*)\s*$")
EXPECTED = re.compile(r"^\s*#\s*(\w+(?:Error|Exception)): (.*)$")


def blocks(path: Path) -> list[tuple[str, int, str]]:
    """(language, first line number, text) of every fenced block of ``path``."""
    found, lang, start, lines = [], None, 0, []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        fence = FENCE.match(line)
        if fence and lang is None:
            lang, start, lines = fence.group(1), number + 1, []
        elif line.strip() == "```" and lang is not None:
            found.append((lang, start, "\n".join(lines)))
            lang = None
        elif lang is not None:
            lines.append(line)
    assert lang is None, f"{path.name}: the block opened at line {start - 1} is never closed"
    return found


def expected_error(lines: list[str], end: int) -> tuple[str, str] | None:
    """The (error name, message) a ``# XError: message`` comment right after line ``end`` (1-based) names."""
    if end < len(lines):
        match = EXPECTED.match(lines[end])
        if match:
            return match.group(1), match.group(2)
    return None


def matches(message: str, pattern: str) -> bool:
    return re.fullmatch(".*".join(re.escape(part) for part in pattern.split("...")), message, re.DOTALL) is not None


def run_python(text: str, where: str, namespace: dict) -> None:
    """Run ``text`` statement by statement in ``namespace``, checking the errors its comments announce."""
    lines = text.splitlines()
    for statement in ast.parse(text, filename=where).body:
        code = compile(ast.Module([statement], type_ignores=[]), f"{where}+{statement.lineno - 1}", "exec")
        error = expected_error(lines, statement.end_lineno)
        if error is None:
            exec(code, namespace)
            continue
        name, message = error
        with pytest.raises(Exception) as caught:
            exec(code, namespace)
        assert type(caught.value).__name__ == name, f"{where}+{statement.lineno - 1}: raised {caught.value!r}, the docs say {name}"
        assert matches(str(caught.value), message), f"{where}+{statement.lineno - 1}: {name} says {str(caught.value)!r}, the docs say {message!r}"


def run_bash(text: str, where: str) -> None:
    """Parse each ``qgpu-dask`` command with the command's parser; run ``qgpu-dask info``."""
    for offset, line in enumerate(text.splitlines()):
        command = line.split("#", 1)[0].strip()
        if not command:
            continue
        words = shlex.split(command)
        assert words[0] == "qgpu-dask", f"{where}+{offset}: only qgpu-dask commands are checked, found {words[0]!r}"
        args = cli.parser().parse_args(words[1:])
        if args.command == "info":
            done = subprocess.run([sys.executable, "-m", "qgpu_dask.cli", *words[1:]], capture_output=True, text=True, timeout=120)
            assert done.returncode == 0 and "shards" in done.stdout, f"{where}+{offset}: {command} failed:\n{done.stderr}"


def checked_blocks(document: str) -> list[tuple[str, int, str]]:
    """The blocks this test runs: all of them but the README's first, the install and test commands that
    CI itself runs (.ci/run)."""
    found = blocks(ROOT / document)
    return found[1:] if document == "README.md" else found


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_block_is_of_a_known_kind(document):
    for lang, line, _ in checked_blocks(document):
        assert lang in RUN | SHOWN, f"{document}:{line}: a block marked {lang!r}: mark it python, bash or text so the docs test knows what to do"


def left_open(namespace: dict) -> list[str]:
    """The names of services a document connected to a cluster and never closed: once that cluster stops, each
    logs a page of connection errors (a service on the client of one that owns its cluster closes with it)."""
    services = {name: value for name, value in namespace.items() if type(value).__name__ == "Service"}
    owners = {id(s.client) for s in services.values() if s.cluster is not None}
    return [name for name, s in services.items() if s.cluster is None and id(s.client) not in owners and not s.closed]


@pytest.mark.parametrize("document", DOCUMENTS)
def test_document_runs_as_written(document, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__main__"}
    try:
        for lang, line, text in checked_blocks(document):
            where = f"{document}:{line}"
            if lang == "python":
                run_python(text, where, namespace)
            elif lang == "bash":
                run_bash(text, where)
        assert not left_open(namespace), f"{document} leaves {left_open(namespace)} connected: close them as a user would"
    finally:
        for value in list(namespace.values()):
            if type(value).__name__ == "Service":
                value.close()
        os.chdir(ROOT)
