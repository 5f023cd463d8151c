"""`graphcost --plot FILE.png`: the memory timeline rasterized by matplotlib (the `png` extra).

The PNG is decoded and its pixels inspected: the colours must be really painted, not just named.
"""
from __future__ import annotations

import struct
import sys

import pytest
from graphcost.analyzer.cli.main import main

pytest.importorskip("matplotlib")
from matplotlib.image import imread  # noqa: E402

SHADES = {"forward": "#e8f0fe", "backward": "#fdf1e5", "optimizer": "#e9f7ef"}  # plot.py's
PLAIN, CHECKPOINTED = "#1a73e8", "#d93025"  # the SVG's curve colours
TRAIN = ["zoo:small_cnn", "--batch", "2", "--train", "--optimizer", "sgd"]


def rgb(hex_: str) -> tuple[int, int, int]:
    return tuple(int(hex_[i:i + 2], 16) for i in (1, 3, 5))


def count(pixels, hex_: str, tol: int = 0) -> int:
    """Pixels within tol (per channel, 0..255) of the colour."""
    return int((abs(pixels - rgb(hex_)).max(axis=2) <= tol).sum())


def decode(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    # IHDR: width, height; figsize 9 x 4 in at 100 dpi = 900 x 400 px
    assert struct.unpack(">II", data[16:24]) == (900, 400)
    img = imread(path)  # floats 0..1, RGBA
    return (img[:, :, :3] * 255).round().astype(int)


def one_line_error(capsys, rc, needle):
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err, err


def test_png_checkpointed(tmp_path):
    out = tmp_path / "t.png"
    assert main(TRAIN + ["--checkpoint", "sqrt", "--plot", str(out), "--max-rows", "1"]) == 0
    px = decode(out)
    # each phase is one flat rectangle: exact colours. The step's shade starts halfway between
    # the last schedule node (at 94% of the width) and the step (100%): 3% of the 783 px plot
    # width = ~23 px by 300 px = ~7_000 pixels less gridlines; forward and backward far more.
    for phase, colour in SHADES.items():
        assert count(px, colour) > 3_000, phase
    # both curves (lines, the peak marker, the peak labels) are painted; small_cnn's
    # checkpointed curve sits below the plain one on nodes 9..34, so the plain one shows there
    assert count(px, PLAIN, tol=8) > 100
    assert count(px, CHECKPOINTED, tol=8) > 100


def test_png_plain_has_no_checkpoint_curve(tmp_path):
    out = tmp_path / "p.png"
    assert main(TRAIN + ["--plot", str(out), "--max-rows", "1"]) == 0
    px = decode(out)
    assert count(px, PLAIN, tol=8) > 100
    assert count(px, CHECKPOINTED, tol=40) == 0  # the negative control for the test above
    assert count(px, SHADES["optimizer"]) > 3_000


def test_png_bad_inputs(tmp_path, capsys, monkeypatch):
    one_line_error(capsys, main(TRAIN + ["--plot", str(tmp_path / "t.jpg")]), ".svg or .png")
    assert not (tmp_path / "t.jpg").exists()
    one_line_error(capsys, main(["zoo:small_cnn", "--plot", str(tmp_path / "t.png")]),
                   "add --train")
    # graphcost without the extra: the install hint, before any analysis is run
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    one_line_error(capsys, main(TRAIN + ["--plot", str(tmp_path / "t.png")]),
                   "PNG output needs matplotlib: pip install 'graphcost[png]'")
    assert not (tmp_path / "t.png").exists()


def test_png_unwritable(tmp_path, capsys):
    # refused before the analysis runs: the folder is missing
    one_line_error(capsys, main(TRAIN + ["--plot", str(tmp_path / "no" / "t.png"),
                                         "--max-rows", "1"]),
                   f"the folder {tmp_path / 'no'} does not exist")
