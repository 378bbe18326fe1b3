"""PNG previews: size, mode, orientation, stretching, and refusal of bad input."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from qgpu_dask.formats.png import save_png, to_uint8


def read(path: Path) -> tuple[Image.Image, np.ndarray]:
    with Image.open(path) as img:
        img.load()
        return img, np.array(img)


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int16", "uint64", "float32", "float64"])
def test_round_trip_size_mode_range(tmp_path: Path, dtype: str) -> None:
    image = np.arange(7 * 11, dtype=np.int64).reshape(7, 11).astype(dtype)
    path = save_png(image, tmp_path / "img.png")
    assert isinstance(path, Path) and path.exists()
    img, pixels = read(path)
    assert img.format == "PNG"
    assert img.mode == "L"
    assert img.size == (11, 7)  # Pillow gives (width, height)
    assert pixels.shape == (7, 11)
    assert pixels.min() == 0 and pixels.max() == 255
    # Row 0 of the array is the top of the picture, and order is kept.
    assert pixels[0, 0] == 0 and pixels[-1, -1] == 255
    assert np.all(np.diff(pixels.ravel().astype(int)) >= 0)


def test_percentiles_clip_outliers(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    image = rng.normal(100.0, 1.0, size=(64, 64))
    image[0, 0] = 1e6  # a hot pixel must not flatten the rest to black
    _, pixels = read(save_png(image, tmp_path / "hot.png"))
    assert pixels[0, 0] == 255
    assert 80 < np.median(pixels) < 175
    _, full = read(save_png(image, tmp_path / "full.png", percentile=(0, 100)))
    assert np.median(full) == 0


def test_log_lifts_faint_values() -> None:
    pattern = np.zeros((32, 32))
    pattern[12:20, 12:20] = 10_000.0  # bright disk
    pattern[:4] = 10.0  # faint dark field
    linear = to_uint8(pattern, percentile=(0, 100))
    logged = to_uint8(pattern, log=True, percentile=(0, 100))
    assert linear[0, 0] < 5
    assert logged[0, 0] > 50
    assert logged[15, 15] == 255 and logged[31, 31] == 0


def test_constant_images_without_division_by_zero(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, zeros = read(save_png(np.zeros((5, 6)), tmp_path / "z.png"))
        _, sevens = read(save_png(np.full((5, 6), 7, dtype=np.uint16), tmp_path / "s.png"))
        _, logged = read(save_png(np.full((5, 6), 7.0), tmp_path / "l.png", log=True))
    assert zeros.shape == (5, 6) and not zeros.any()
    assert np.all(sevens == 128)
    assert np.all(logged == 128)


def test_mostly_constant_still_stretched() -> None:
    image = np.zeros((100, 100))
    image[0, 0] = 1.0  # both percentiles land on 0: fall back to the full range
    pixels = to_uint8(image)
    assert pixels[0, 0] == 255 and pixels.min() == 0


def test_nan_pixels_black_rest_stretched(tmp_path: Path) -> None:
    image = np.linspace(0.0, 1.0, 40).reshape(5, 8)
    image[2, 3] = np.nan
    image[4, 0] = np.inf
    _, pixels = read(save_png(image, tmp_path / "nan.png", percentile=(0, 100)))
    assert pixels[2, 3] == 0 and pixels[4, 0] == 0
    assert pixels.max() == 255


def test_bool_image() -> None:
    pixels = to_uint8(np.eye(4, dtype=bool))
    assert set(np.unique(pixels)) == {0, 255}


def test_creates_parent_folder(tmp_path: Path) -> None:
    path = save_png(np.eye(3), str(tmp_path / "a" / "b" / "eye.png"))
    assert path == tmp_path / "a" / "b" / "eye.png" and path.exists()


@pytest.mark.parametrize(
    "image",
    [
        np.zeros(5),
        np.zeros((2, 3, 4)),
        np.zeros((0, 4)),
        np.full((3, 3), np.nan),
        np.full((3, 3), np.inf),
        np.zeros((3, 3), dtype=np.complex64),
        np.array([["a", "b"]]),
    ],
)
def test_bad_images_raise(tmp_path: Path, image: np.ndarray) -> None:
    with pytest.raises(ValueError):
        save_png(image, tmp_path / "bad.png")
    assert not (tmp_path / "bad.png").exists()


@pytest.mark.parametrize("percentile", [(50, 50), (60, 40), (-1, 99), (1, 101)])
def test_bad_percentiles_raise(percentile: tuple[float, float]) -> None:
    with pytest.raises(ValueError):
        to_uint8(np.eye(3), percentile=percentile)
