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


@pytest.fixture
def quick_rowsums(monkeypatch):
    """The study's row-sum study with a 6-point global-scaling grid instead of 101 (10x less work)."""
    import functools

    import mxattention.eval.study as study

    monkeypatch.setattr(
        study, "rowsum_study", functools.partial(study.rowsum_study, global_grid=torch.linspace(1.0, 1.5, 6))
    )
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_demo_small(tmp_path, capsys, quick_rowsums):
    pytest.importorskip("transformers")
    pytest.importorskip("terrain_diffusion")
    rc = main(
        [
            "demo",
            "--out",
            str(tmp_path / "new" / "demo"),
            "--texts",
            "2",
            "--seeds",
            "0",
            "3",
            "--methods",
            "mxfp4-ocp",
            "mxattention",
            "--threads",
            "1",
        ]
    )
    assert rc == 0
    out = tmp_path / "new" / "demo"
    captured = capsys.readouterr()
    assert "mxattention" in captured.out and "terrain PSNR dB" in captured.out
    assert "mean of 2 paired seed(s)" in captured.out
    assert "torch threads: 1 (--threads" in captured.err
    assert "terrain: layer errors, row sums, q sweeps" in captured.err  # the progress bars
    assert "Loading weights" not in captured.err
    report = (out / "report.md").read_text()
    lines = report.splitlines()
    for png in (
        "heightmaps.png",
        "rowsums.png",
        "terrain_layer_errors.png",
        "minilm_layer_errors.png",
        "terrain_psnr.png",
        "uos_objective.png",
    ):
        assert (out / png).stat().st_size > 5000
        at = next(i for i, line in enumerate(lines) if line.startswith("![") and f"({png})" in line)
        assert lines[at + 2].startswith("*"), f"no caption under {png}"
    data = json.loads((out / "study.json").read_text())
    assert set(data["terrain"]["heightmap_quality"]) == {"fp", "mxfp4-ocp", "mxattention"}
    # The conclusion quotes the numbers of the tables.
    q = data["terrain"]["heightmap_quality"]
    concl = report.split("## Conclusion")[1].split("##")[0]
    assert f"mxattention {q['mxattention']['psnr_db']:.2f} dB" in concl
    assert f"{min(q['mxattention']['psnr_per_seed']):.1f}-" in concl
    # Attention calls counted by the patch: 28 per heightmap, 2 seeds, nothing fell back.
    calls = data["terrain"]["attention_calls"]
    assert calls["mxattention"] == {"routed": 56, "high_precision": 0, "fallback": 0, "fallback_reasons": {}}
    assert "| mxattention | " in report and " 56 / 0 / 0 |" in report
    assert data["minilm"]["attention_calls"]["fp"]["routed"] == 6
    # The row-sum figure is the layer the caption names: the one with the highest mean entropy.
    rs = data["terrain"]["rowsum"]
    top = max(range(len(rs)), key=lambda i: rs[i]["mean_entropy"])
    caption = next(line for line in lines if line.startswith("*Row sums"))
    assert data["terrain"]["layers"][top] in caption and f"{rs[top]['mean_row_sum']:.4f}" in caption
    assert "heightmap PSNR (dB, mean of 2)" in report and "(1 = identical)" in report
    # One duration, the same in report.md, study.json and on stdout.
    sec = f"{data['meta']['seconds']:.0f} s from the {data['meta']['seconds_from']}"
    assert f"({sec} to this report)" in report and f"({sec})" in captured.out
    # The caption's token counts are a row of the per-layer table it points to.
    assert "| keys per row | 1024 | 1024 |" in report and "(row 'keys per row' of the per-layer" in report
    cos = data["minilm"]["embedding_cosine"]
    best_t = max(("mxfp4-ocp", "mxattention"), key=lambda k: q[k]["psnr_db"])
    best_m = max(("mxfp4-ocp", "mxattention"), key=cos.__getitem__)
    leader = f"on both models: {best_t}" if best_t == best_m else f"{best_t} on terrain, {best_m} on MiniLM"
    assert "Most accurate 4-bit-class method (Q K^T in 4 bits)" in concl and leader in concl
    # The study's numbers on this real run (tests/eval/test_study.py checks run_study's own files on
    # stored results, so the two real models run end to end once in the suite: here).
    assert q["mxattention"]["psnr_db"] > 20
    assert data["minilm"]["layer_rel_l2"]["fp"] == [0.0] * 6
    assert len(data["terrain"]["layer_rel_l2"]["mxattention"]) == 28
    assert all(e > 0 for e in data["terrain"]["layer_rel_l2"]["mxfp4-ocp"])
    assert 0.5 < data["minilm"]["rowsum"][0]["mean_row_sum"] < 1.0
    # The study's tables render from the demo's study.json.
    from mxattention.eval.study import main as study_main

    assert study_main(["--out", str(out), "--render-only"]) == 0
    assert (out / "study.md").read_text().startswith("# Study on real pretrained weights")
    table = (out / "readme_table.md").read_text()
    assert "2 paired seed(s): 0, 3" in table and "| **mxattention** (Hadamard + UOS + PNQ) |" in table


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


def test_bench_prints_the_kernel_plan(capsys):
    """`bench --plan` prints each method's kernel plan of the case: on a GPU the kernel's (tiles,
    pre-pass), where the reference runs (a CPU) that path and its reason in one line."""
    args = ["bench", "--shape", "1", "2", "64", "32", "--methods", "mxattention", "nvfp4", "--repeat", "1"]
    assert main([*args, "--dtype", "float32", "--plan"]) == 0
    out = capsys.readouterr().out
    if torch.cuda.is_available():
        assert "plan of mxattention on " in out and "tiles: BM " in out and "pre-pass: Q^ " in out
    else:
        assert "plan of mxattention: PyTorch reference (the tensors are on cpu" in out and "tiles:" not in out
    assert "plan of nvfp4: PyTorch reference" in out
    assert out.index("plan of mxattention") < out.index("torch sdpa")
