"""Constants the CUDA kernels share with Python are written once, in Python, and reach each kernels/*.cu as -D
options from the module compiling it (``DEFINES``); a source lists what it expects (``#ifndef NAME`` /
``#error "NAME comes from <module>"``) and writes none of them itself, so the two sides cannot drift.

CPU only: the sources are read as text, and where CuPy is missing empty stand-ins let the compiling modules
import (only their constants are read; the modules stay imported, bound to the stand-ins, which nothing on a
CPU calls)."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest

from conftest import compiling_module

ROOT = Path(__file__).resolve().parents[1]
COMPILERS = {  # each kernel source and the module that compiles it
    "compressed.cu": "qgpu_dask/resident/cuda/compressed.py",
    "groups.cu": "qgpu_dask/resident/cuda/groups.py",
    "dense.cu": "qgpu_dask/resident/cuda/dense.py",
    "ssb.cu": "qgpu_dask/phase/cuda.py",
    "solve.cu": "qgpu_dask/phase/solve_cuda.py",
    "ptycho.cu": "qgpu_dask/phase/iterative/cuda.py",
    "bitshuffle_lz4.cu": "qgpu_dask/formats/bitshuffle_lz4_cuda.py",
    "sha256.cu": "qgpu_dask/formats/sha256_cuda.py",
}
EXPECTED = re.compile(r'#ifndef (\w+)\n#error "(\w+) comes from (qgpu_dask/[\w/]+\.py)"\n#endif\n')
WRITTEN = re.compile(r"^\s*#define (\w+)|\bconstexpr \w+ (\w+) =", re.MULTILINE)


def source(file: str) -> str:
    return (ROOT / "kernels" / file).read_text()


def expected(file: str) -> dict[str, str]:
    """The constants ``file`` expects from Python, each with the module its #error names."""
    found = {}
    for name, named, path in EXPECTED.findall(source(file)):
        assert named == name
        found[name] = path
    return found


def written(file: str) -> set[str]:
    """The names ``file`` defines itself (macros and constexpr constants)."""
    return {define or constant for define, constant in WRITTEN.findall(source(file))}


def sent(module: types.ModuleType) -> dict[str, str]:
    """The -D options a compiling module sends, as name: value."""
    return dict(option.removeprefix("-D").split("=", 1) for option in module.DEFINES)


def python_constants(module: types.ModuleType) -> set[str]:
    return {name for name in vars(module) if name.isupper()}


@pytest.fixture(scope="module")
def modules() -> dict[str, types.ModuleType]:
    """Every compiling module and every module a source names, by path."""
    paths = set(COMPILERS.values()) | {path for file in COMPILERS for path in expected(file).values()}
    return {path: compiling_module(path.removesuffix(".py").replace("/", ".")) for path in paths}


def test_every_source_is_listed():
    assert sorted(path.name for path in (ROOT / "kernels").glob("*.cu")) == sorted(COMPILERS)


@pytest.mark.parametrize("file", COMPILERS)
def test_each_expected_constant_is_sent(file, modules):
    """What a source expects is what its compiling module sends: no constant missing, none unused."""
    assert set(sent(modules[COMPILERS[file]])) == set(expected(file))


@pytest.mark.parametrize("file", COMPILERS)
def test_each_constant_is_the_value_of_the_module_named(file, modules):
    for name, path in expected(file).items():
        value = getattr(modules[path], name)
        assert sent(modules[COMPILERS[file]])[name].removesuffix("u") == str(value)


@pytest.mark.parametrize("file", COMPILERS)
def test_no_source_writes_a_python_constant(file, modules):
    """A hand copy in a source (a #define or constexpr of a name its Python defines) is what this test stops."""
    python = set(expected(file)) | python_constants(modules[COMPILERS[file]])
    for path in set(expected(file).values()):
        python |= python_constants(modules[path])
    assert written(file) & python == set()


def test_unsigned_constants_keep_their_spelling(modules):
    """The codec's unsigned constants reach compressed.cu spelled as its #defines were (C arithmetic tells 65536u
    from 65536); OFFSET_MASK was ((1u << FORM_SHIFT) - 1u)."""
    options = sent(modules[COMPILERS["compressed.cu"]])
    assert options["STATE_LOW"] == "65536u"
    assert options["SLOT_MASK"] == "4095u"
    assert options["OFFSET_MASK"] == f"{(1 << 29) - 1}u" == "536870911u"
    assert options["PROB_BITS"] == "12"


def test_defines_renders_ints_and_strings_only(modules):
    compile = modules[COMPILERS["ssb.cu"]].compile
    assert compile.defines(A=1, B="2u") == ("-DA=1", "-DB=2u")
    with pytest.raises(TypeError, match="kernel constant C must be an int or a str, got float"):
        compile.defines(C=1.5)
