"""The seed-by-seed study of mxattention-pv8 against mxattention: per-call errors, the independent
operand check, the offset split, the paired statistics and the report (the terrain model stubbed)."""

from __future__ import annotations

import dataclasses
import json
import math

import ladder_trace as lt
import pytest
import torch

from mxattention.attention.config import PRESETS
from mxattention.ops import scaled_dot_product_attention


def _qkv(seed: int, lq: int = 150, lk: int = 200):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, lq, 32, generator=g) * torch.exp(torch.randn(32, generator=g))
    k = torch.randn(1, 2, lk, 32, generator=g) + 1.5
    v = torch.randn(1, 2, lk, 32, generator=g)
    v[..., 3, :] *= 40.0  # an outlier key row of V
    return q, k, v


@pytest.mark.parametrize("method", ["mxattention", "mxattention-pv8", "mxfp8", "mxfp4-ocp"])
def test_fake_quantize_attention_is_the_preset(method):
    q, k, v = _qkv(0)
    got = lt.fake_quantize_attention(q, k, v, PRESETS[method], 32**-0.5)
    want = scaled_dot_product_attention(q, k, v, scale=32**-0.5, method=method)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-6)
    exact = scaled_dot_product_attention(q, k, v, scale=32**-0.5, method="fp")
    assert (got - exact).abs().max() > 1e-3  # it quantizes


def test_fake_quantize_attention_sees_a_wrong_p_ladder():
    q, k, v = _qkv(1)
    pv8 = PRESETS["mxattention-pv8"]
    wrong = dataclasses.replace(pv8, p=PRESETS["mxattention"].p)  # P~ in E2M1 instead of E4M3
    want = scaled_dot_product_attention(q, k, v, scale=0.2, method=pv8)
    assert (lt.fake_quantize_attention(q, k, v, wrong, 0.2) - want).abs().max() > 1e-3


def test_fake_quantize_attention_refuses_what_it_does_not_rebuild():
    q, k, v = _qkv(2)
    for name in ("mxattention-pv8-smooth", "nvfp4", "fp"):
        with pytest.raises(ValueError, match="not an all-MX preset without smoothing"):
            lt.fake_quantize_attention(q, k, v, PRESETS[name], 0.2)


def test_call_errors_record_each_call_against_exact():
    q, k, v = _qkv(3)
    fn = lt.CallErrors("mxattention-pv8", lt.SPLIT, check=True, keep_inputs=True)
    out = fn(q, k, v, scale=0.25)
    fn(q[..., :64, :], k, v, scale=0.25)
    want = scaled_dot_product_attention(q, k, v, scale=0.25, method="mxattention-pv8")
    assert torch.equal(out, want)
    exact = scaled_dot_product_attention(q, k, v, scale=0.25, method="fp")
    assert fn.errors[0] == pytest.approx(float((want - exact).norm() / exact.norm()), rel=1e-6)
    assert len(fn.errors) == 2 and all(len(e) == 2 for e in fn.split.values())
    # pv8 = its Q, K error with a small P~V error on top; P~, V in MXFP4 alone is the larger P~V error.
    split = {n: e[0] for n, e in fn.split.items()}
    assert split["P~, V MXFP8 E4M3 (UOS, PNQ)"] < split["P~, V MXFP4 (UOS, PNQ)"]
    assert fn.errors[0] == pytest.approx(split["Q, K MXFP4 (Hadamard, UOS)"], rel=0.2)
    assert fn.check_max_abs == [0.0, 0.0] or max(fn.check_max_abs) < 1e-5
    assert fn.inputs is not None and fn.inputs[0].shape == (2 * 32 * (150 + 200 + 200),)
    fp = lt.CallErrors("fp")
    fp(q, k, v, scale=0.25)
    assert fp.errors == [0.0] and fp.inputs is None
    with pytest.raises(ValueError, match="explicit scale"):
        lt.CallErrors("mxattention", check=True)(q, k, v)


def test_offset_split():
    ref = torch.randn(1, 1, 8, 8)
    assert lt.offset_split(ref + 0.5, ref) == pytest.approx({"offset": 0.5, "rms": 0.5, "offset_share": 1.0})
    checker = torch.tensor([1.0, -1.0]).repeat(32).reshape(1, 1, 8, 8) * 0.1
    s = lt.offset_split(ref + checker, ref)
    assert s["offset"] == pytest.approx(0.0, abs=1e-7) and s["offset_share"] == pytest.approx(0.0, abs=1e-7)
    assert s["rms"] == pytest.approx(0.1)
    half = lt.offset_split(ref + 0.1 + checker, ref)  # offset 0.1, the rest 0.1 rms: half the square
    assert half["offset_share"] == pytest.approx(0.5) and half["rms"] == pytest.approx(math.sqrt(0.02))


def test_paired_stats():
    s = lt.paired_stats([1.0, 3.0, 5.0, 7.0])
    assert s["mean"] == 4.0 and s["median"] == 4.0 and s["positive"] == 4
    assert s["sd"] == pytest.approx(math.sqrt(20 / 3))
    assert s["se"] == pytest.approx(math.sqrt(20 / 3) / 2)
    assert s["seeds_for_se"] == 7  # ceil(6.67)
    assert lt.paired_stats([0.0, 4.0], se_target=0.5)["seeds_for_se"] == 32
    with pytest.raises(ValueError, match="at least 2"):
        lt.paired_stats([1.0])


def _seed(seed: int, mx_off: float, pv8_off: float, split: bool) -> dict:
    def rec(psnr: float, off: float, err: float) -> dict:
        r = {
            "psnr_db": psnr,
            "call_rel_l2": [err] * 28,
            "offset": off,
            "rms": abs(off) * 1.1,
            "offset_share": 0.8,
        }
        if split:
            r["check_max_abs"] = 0.0
            r["input_rel_l2"] = [err / 10] * 28
        return r

    # The PSNR difference follows the offsets, as the study finds for the terrain UNet.
    d = 20 * math.log10(abs(mx_off) / abs(pv8_off))
    out = {
        "seed": seed,
        lt.MX4: rec(50.0, mx_off, 0.09),
        lt.PV8: rec(50.0 + d, pv8_off, 0.06),
        lt.QK4: rec(50.0 + d, pv8_off * 1.01, 0.059),
    }
    if split:
        out["split"] = {n: [0.05] * 28 for n in lt.SPLIT}
    return out


def test_report_from_stubbed_seeds(tmp_path):
    per = [_seed(0, 4e-3, 2e-3, True), _seed(1, -1e-2, 3e-3, False), _seed(2, -2.4e-3, 2.5e-3, True)]
    summ = lt.summarize(per)
    assert summ["calls"] == 84 and summ["calls_pv8_lower"] == 84
    assert summ["pv4_offset_opposes_qk"] == 2  # seeds 1 and 2: mx's P~V offset against the Q, K one
    assert summ["offset_prediction_r"] == pytest.approx(1.0)
    assert summ["diff_db"][2] < 0 < summ["diff_db"][0]
    res = {
        "per_seed": per,
        "summary": summ,
        "meta": {"date": "2026-12-01", "machine": "test", "torch": "x", "command": "cmd", "seconds": 1.0},
    }
    md = lt.render_markdown(json.loads(json.dumps(res)))
    assert "84 of 84 attention calls" in md and "seed 2 (-0.35 dB" in md
    assert f"{summ['stats']['all']['mean']:+.2f} +- {summ['stats']['all']['se']:.2f} dB" in md
    assert md.count("| 0 |") == 2  # seed 0 in the per-seed table and in the per-operand table
    lt.plot(res, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 10_000


def test_cli_refuses_one_seed(capsys):
    with pytest.raises(SystemExit) as e:
        lt.main(["--seeds", "3"])
    assert e.value.code == 2 and "at least 2 distinct seeds" in capsys.readouterr().err


def test_cli_refuses_trace_seeds_it_would_not_run(capsys, monkeypatch):
    """A --trace-seeds seed outside --seeds would be traced nowhere: a usage error, before any work."""
    monkeypatch.setattr(lt, "run", lambda *a, **kw: pytest.fail("ran"))
    with pytest.raises(SystemExit) as e:
        lt.main(["--seeds", "0", "1", "--trace-seeds", "3"])
    assert e.value.code == 2 and "--trace-seeds [3] must be among --seeds" in capsys.readouterr().err
