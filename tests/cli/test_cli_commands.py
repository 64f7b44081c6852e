"""The demo, diagnose and bench subcommands: they run, write what they promise, and refuse bad input."""

from __future__ import annotations

import json

import pytest
import torch

from mxattention.cli.main import main

pytest.importorskip("matplotlib")


def test_help_for_every_subcommand(capsys):
    for cmd in ("demo", "diagnose", "bench", "theory"):
        assert main([cmd, "--help"]) == 0
        assert "usage: mxattention" in capsys.readouterr().out


def test_demo_small(tmp_path, capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("terrain_diffusion")
    rc = main(
        [
            "demo",
            "--out",
            str(tmp_path),
            "--texts",
            "2",
            "--seeds",
            "0",
            "--methods",
            "mxfp4-ocp",
            "mxattention",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "mxattention" in out and "terrain PSNR dB" in out
    report = (tmp_path / "report.md").read_text()
    for png in (
        "heightmaps.png",
        "rowsums.png",
        "terrain_layer_errors.png",
        "minilm_layer_errors.png",
        "terrain_psnr.png",
    ):
        assert (tmp_path / png).stat().st_size > 5000
        assert png in report
    data = json.loads((tmp_path / "study.json").read_text())
    assert set(data["terrain"]["heightmap_quality"]) == {"fp", "mxfp4-ocp", "mxattention"}


def test_demo_rejects_unknown_method(capsys):
    assert main(["demo", "--methods", "mxfp5"]) == 2
    assert "unknown method(s) mxfp5" in capsys.readouterr().err


def test_diagnose_saved_tensors(tmp_path, capsys):
    g = torch.Generator().manual_seed(0)
    layer = {
        "q": torch.randn(1, 2, 64, 32, generator=g),
        "k": torch.randn(1, 2, 64, 32, generator=g),
        "v": torch.randn(1, 2, 64, 32, generator=g),
    }
    path = tmp_path / "qkv.pt"
    torch.save([layer, layer], path)
    rc = main(
        [
            "diagnose",
            "--tensors",
            str(path),
            "--methods",
            "mxattention",
            "--json",
            str(tmp_path / "d.json"),
            "--plot",
            str(tmp_path / "d.png"),
        ]
    )
    assert rc == 0
    rows = json.loads((tmp_path / "d.json").read_text())
    assert len(rows) == 2 and rows[0]["rel_l2"]["mxattention"] > 0
    assert 0.5 < rows[0]["rowsum"]["mean_row_sum"] < 1.05
    assert (tmp_path / "d.png").stat().st_size > 5000
    assert "layer1" in capsys.readouterr().out


def test_diagnose_bad_file(tmp_path, capsys):
    assert main(["diagnose", "--tensors", str(tmp_path / "missing.pt")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.pt"
    torch.save({"q": torch.zeros(1)}, bad)
    assert main(["diagnose", "--tensors", str(bad)]) == 2
    assert "must be a dict with keys q, k, v" in capsys.readouterr().err


def test_bench_cpu(capsys):
    assert (
        main(
            [
                "bench",
                "--shape",
                "1",
                "1",
                "64",
                "32",
                "--methods",
                "mxattention",
                "--repeat",
                "1",
                "--dtype",
                "float32",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "torch sdpa" in out and "mxattention" in out
    assert main(["bench", "--shape", "0", "1", "64", "32"]) == 2
