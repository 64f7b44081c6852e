"""Why the terrain PSNR of `mxattention-pv8` against `mxattention` swings by +-10 dB from seed to seed.

    python benchmarks/ladder_trace.py [--seeds 0 1 ... 31] [--trace-seeds 0 3] [--out docs/results/ladder]

Issue 16 (item 5) asks for `mxattention-pv8` >= +6 dB over `mxattention` on the terrain UNet. Per seed
this runs the UNet (one denoising step, 28 attention calls) with `fp`, `mxattention`, `mxattention-pv8`
and `pv8-pv-fp32` (the same Q, K quantization with P~ and V exact) and records:

- per attention call, on each method's own forward pass, the rel-L2 of its output against the exact
  (`fp`) attention of the same Q, K, V (`CallErrors`); on the --trace-seeds also the split by operand:
  Q, K in MXFP4 alone, P~, V in MXFP4 alone, P~, V in MXFP8 E4M3 alone (every other operand exact);
- the error of the denoised map (model space, before the height transform) against fp, its uniform
  offset (the mean over the map) and the share of its squared error that offset carries;
- the heightmap PSNR (as `benchmarks/ladder.py`) and the paired difference pv8 - mxattention,
  with its mean, standard deviation, standard error and the seeds a standard error of 1 dB needs.

Writes `ladder_trace.json`, `ladder_trace.md` and `ladder_trace.png` under --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from mxattention.attention.config import PRESETS, AttentionConfig
from mxattention.eval.diagnostics.errors import output_error
from mxattention.formats.mx import fake_quantize
from mxattention.ops import scaled_dot_product_attention
from mxattention.rotation import rotate

MX4, PV8 = "mxattention", "mxattention-pv8"
QK4 = "pv8-pv-fp32"  # the ladder's ablation: pv8's Q, K quantization, P~ and V exact

_mx, _pv8 = PRESETS[MX4], PRESETS[PV8]
QK4_CONFIG = dataclasses.replace(_pv8, name=QK4, v=None, p=None, notes="P~, V in fp32")
# One operand pair quantized at a time, every other operand exact (on the same inputs).
SPLIT: dict[str, AttentionConfig] = {
    "Q, K MXFP4 (Hadamard, UOS)": dataclasses.replace(QK4_CONFIG, name="split-qk4"),
    "P~, V MXFP4 (UOS, PNQ)": AttentionConfig("split-pv4", None, None, _mx.v, _mx.p, pnq=True),
    "P~, V MXFP8 E4M3 (UOS, PNQ)": AttentionConfig("split-pv8", None, None, _pv8.v, _pv8.p, pnq=True),
}


def fake_quantize_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: AttentionConfig, scale: float
) -> torch.Tensor:
    """`cfg`'s attention rebuilt from `formats.fake_quantize` and `rotation.rotate` alone, for the MX
    presets without smoothing (Hadamard on Q, K; Q, K along the head dim, V along the keys; P~ per 32 keys
    of each `block_n` tile with the running max; PNQ row sums): an independent check of the operands.
    q, k, v [B, H, L, D] float32, no mask."""
    if (
        cfg.smooth_q
        or cfg.smooth_k
        or not all(s is not None and s.is_mx for s in (cfg.q, cfg.k, cfg.v, cfg.p))
    ):
        raise ValueError(f"fake_quantize_attention: {cfg.name} is not an all-MX preset without smoothing")
    if cfg.p_row_scale != 1.0:
        raise ValueError(f"fake_quantize_attention: {cfg.name} scales P~ rows")

    def fq(x: torch.Tensor, spec: Any, axis: int) -> torch.Tensor:
        return fake_quantize(x, axis, rule=spec.rule, elem=spec.elem)

    if cfg.hadamard:
        q, k = rotate(q), rotate(k)
    s_all = (fq(q, cfg.q, -1) @ fq(k, cfg.k, -1).transpose(-1, -2)) * scale
    vq = fq(v, cfg.v, -2)
    m = torch.full((*q.shape[:-1], 1), -math.inf)
    l = torch.zeros_like(m)
    o = torch.zeros((*q.shape[:-1], v.shape[-1]))
    for k0 in range(0, k.shape[-2], cfg.block_n):
        s_t = s_all[..., k0 : k0 + cfg.block_n]
        m_new = torch.maximum(m, s_t.amax(-1, keepdim=True))
        p_tilde = torch.exp(s_t - m_new)
        p_hat = fq(p_tilde, cfg.p, -1)
        alpha = torch.exp(m - m_new)
        l = alpha * l + (p_hat if cfg.pnq else p_tilde).sum(-1, keepdim=True)
        o = alpha * o + p_hat @ vq[..., k0 : k0 + cfg.block_n, :]
        m = m_new
    return o / l


class CallErrors:
    """An SDPA-signature attention function: `method`'s output, and per call the rel-L2 of it against
    the exact attention of the same inputs (`errors`), plus each `split` config's rel-L2 (`split`) and,
    with `check`, the largest |output - fake_quantize_attention| of each call (`check_max_abs`)."""

    def __init__(
        self,
        method: str | AttentionConfig,
        split: dict[str, AttentionConfig] | None = None,
        check: bool = False,
        keep_inputs: bool = False,
    ) -> None:
        self.method = method
        self.split_configs = split or {}
        self.check = check
        self.errors: list[float] = []
        self.split: dict[str, list[float]] = {name: [] for name in self.split_configs}
        self.check_max_abs: list[float] = []
        self.inputs: list[torch.Tensor] | None = [] if keep_inputs else None

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        call = partial(
            scaled_dot_product_attention,
            q,
            k,
            v,
            attn_mask,
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
        )
        if self.inputs is not None:
            self.inputs.append(torch.cat([q.flatten(), k.flatten(), v.flatten()]).detach().clone())
        exact = call(method="fp")
        out = call(method=self.method)
        self.errors.append(output_error(out, exact)[0])
        for name, cfg in self.split_configs.items():
            self.split[name].append(output_error(call(method=cfg), exact)[0])
        if self.check:
            if attn_mask is not None or is_causal or scale is None:
                raise ValueError("CallErrors(check=True) needs an explicit scale and no mask")
            ref = fake_quantize_attention(
                q, k, v, PRESETS[self.method] if isinstance(self.method, str) else self.method, scale
            )
            self.check_max_abs.append(float((out - ref).abs().max()))
        return out


def offset_split(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """The error of the map `out` against `ref` (same shape): its uniform offset (mean, model units),
    its rms, and the share of its squared error the offset carries (offset**2 / mean square)."""
    d = (out.double() - ref.double()).flatten()
    ms = float((d * d).mean())
    off = float(d.mean())
    return {"offset": off, "rms": math.sqrt(ms), "offset_share": off * off / ms if ms else 0.0}


def paired_stats(diffs: Sequence[float], se_target: float = 1.0) -> dict[str, float]:
    """Mean, sample standard deviation, standard error of the mean (sd / sqrt(n)), median and the
    number of paired seeds for a standard error of `se_target` (ceil((sd / se_target)**2))."""
    n = len(diffs)
    if n < 2:
        raise ValueError(f"paired_stats needs at least 2 differences, got {n}")
    sd = statistics.stdev(diffs)
    return {
        "n": n,
        "mean": statistics.fmean(diffs),
        "sd": sd,
        "se": sd / math.sqrt(n),
        "median": statistics.median(diffs),
        "positive": sum(d > 0 for d in diffs),
        "seeds_for_se": math.ceil(round((sd / se_target) ** 2, 9)),  # (round: 32.0000001 is 32)
        "se_target": se_target,
    }


def trace_seed(seed: int, split: bool = False) -> dict[str, Any]:
    """One seed: per-call errors, the offset split of the denoised map and the heightmap PSNR of
    `mxattention`, `mxattention-pv8` and `pv8-pv-fp32` against fp."""
    from mxattention.eval.models.terrain import denoise_seeds, heights_from_model_space
    from mxattention.eval.study import heightmap_quality

    fp = CallErrors("fp", keep_inputs=split)
    ref = denoise_seeds([seed], attn_fn=fp)
    ref_h = heights_from_model_space(ref)
    out: dict[str, Any] = {"seed": seed}
    for name, cfg in ((MX4, MX4), (PV8, PV8), (QK4, QK4_CONFIG)):
        fn = CallErrors(
            cfg, SPLIT if split and name == MX4 else None, check=split and name != QK4, keep_inputs=split
        )
        den = denoise_seeds([seed], attn_fn=fn)
        out[name] = {
            "psnr_db": float(heightmap_quality(heights_from_model_space(den), ref_h)["psnr_per_seed"][0]),
            "call_rel_l2": fn.errors,
            **offset_split(den, ref),
        }
        if fn.inputs is not None and fp.inputs is not None:
            # How far this pass's attention inputs (Q, K, V of each call) have moved from fp's.
            out[name]["input_rel_l2"] = [
                output_error(a, b)[0] for a, b in zip(fn.inputs, fp.inputs, strict=True)
            ]
        if fn.split:
            out["split"] = fn.split
        if fn.check_max_abs:
            out[name]["check_max_abs"] = max(fn.check_max_abs)
    return out


def _pearson(x: Sequence[float], y: Sequence[float]) -> float:
    mx, my = statistics.fmean(x), statistics.fmean(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx and syy else math.nan


def summarize(per_seed: Sequence[dict[str, Any]], subsets: Sequence[int] = (4, 8)) -> dict[str, Any]:
    """Over the seeds: the paired statistics of pv8 - mxattention (all seeds and the first `subsets`),
    how often pv8's per-call error is the lower one, the offset shares, and how well the offsets alone
    predict the PSNR difference (20 log10 |offset mx / offset pv8|, Pearson r with the difference)."""
    diffs = [r[PV8]["psnr_db"] - r[MX4]["psnr_db"] for r in per_seed]
    calls = [
        (a, b) for r in per_seed for a, b in zip(r[MX4]["call_rel_l2"], r[PV8]["call_rel_l2"], strict=True)
    ]
    stats = {f"first_{n}": paired_stats(diffs[:n]) for n in subsets if 2 <= n < len(diffs)}
    stats["all"] = paired_stats(diffs)
    # The ceiling of any P~V precision over mxattention: the same Q, K with P~, V exact.
    ceiling = paired_stats([r[QK4]["psnr_db"] - r[MX4]["psnr_db"] for r in per_seed])
    # PSNR of the seeds' mean squared error (each seed's MSE relative to its own range squared).
    pooled = {
        m: -10 * math.log10(statistics.fmean(10 ** (-r[m]["psnr_db"] / 10) for r in per_seed))
        for m in (MX4, PV8, QK4)
    }
    predicted = [20 * math.log10(abs(r[MX4]["offset"]) / abs(r[PV8]["offset"])) for r in per_seed]
    # mxattention's own P~V offset: its offset less that of the same Q, K with P~, V exact.
    pv_part = [r[MX4]["offset"] - r[QK4]["offset"] for r in per_seed]
    checks = [r[m]["check_max_abs"] for r in per_seed for m in (MX4, PV8) if "check_max_abs" in r[m]]
    return {
        "diff_db": diffs,
        "stats": stats,
        "calls": len(calls),
        "calls_pv8_lower": sum(b < a for a, b in calls),
        "mean_call_rel_l2": {
            m: statistics.fmean(e for r in per_seed for e in r[m]["call_rel_l2"]) for m in (MX4, PV8, QK4)
        },
        "offset_share": {
            m: statistics.fmean(r[m]["offset_share"] for r in per_seed) for m in (MX4, PV8, QK4)
        },
        "offset_predicted_db": predicted,
        "offset_prediction_r": _pearson(predicted, diffs),
        "pv4_offset_opposes_qk": sum(
            a * r[QK4]["offset"] < 0 for a, r in zip(pv_part, per_seed, strict=True)
        ),
        "pv_exact_over_mx": ceiling,
        "pooled_psnr_db": pooled,
        "qk_offset_positive": sum(r[QK4]["offset"] > 0 for r in per_seed),
        "calls_pv8_not_lower": [
            [r["seed"], i, a, b]
            for r in per_seed
            for i, (a, b) in enumerate(zip(r[MX4]["call_rel_l2"], r[PV8]["call_rel_l2"], strict=True))
            if b >= a
        ],
        "psnr_pv8_vs_pv_exact": paired_stats([r[PV8]["psnr_db"] - r[QK4]["psnr_db"] for r in per_seed]),
        "check_max_abs": max(checks) if checks else None,
        "checked_seeds": [r["seed"] for r in per_seed if "check_max_abs" in r[MX4]],
    }


def _fmt_stats(s: dict[str, float], who: str = "pv8") -> str:
    return (
        f"{s['mean']:+.2f} +- {s['se']:.2f} dB (mean +- standard error; sd {s['sd']:.2f}, median "
        f"{s['median']:+.2f}, {who} ahead on {s['positive']} of {s['n']})"
    )


def conclusion(res: dict[str, Any]) -> list[str]:
    """The findings as bullets, every number from `res`."""
    summ, per = res["summary"], res["per_seed"]
    st, share, pooled = summ["stats"], summ["offset_share"], summ["pooled_psnr_db"]
    allst, ceil = st["all"], summ["pv_exact_over_mx"]
    worst = min(range(len(per)), key=lambda i: summ["diff_db"][i])
    w = per[worst]
    exceptions = summ["calls_pv8_not_lower"]
    exc = ""
    if exceptions:
        exc = (
            " The exceptions ("
            + ", ".join(f"seed {sd} call {i}" for sd, i, _, _ in exceptions)
            + f"; pv8 higher by at most {max(b / a - 1 for _, _, a, b in exceptions):.0%}) are calls on inputs that "
            "already differ between the two passes; Q, K's error, the larger part of either, depends on them."
        )
    pe = summ["psnr_pv8_vs_pv_exact"]
    out = [
        f"- pv8's attention error is the lower one at {summ['calls_pv8_lower']} of {summ['calls']} attention "
        f"calls ({len(per)} seeds x 28 calls, each on the method's own forward pass, against the exact "
        f"attention of the same inputs): mean per-call rel-L2 {summ['mean_call_rel_l2'][PV8]:.4f} against "
        f"{summ['mean_call_rel_l2'][MX4]:.4f}, and {summ['mean_call_rel_l2'][QK4]:.4f} with P~, V exact "
        f"(`pv8-pv-fp32`): what pv8 keeps is the error of Q, K in MXFP4.{exc}",
    ]
    if summ["check_max_abs"] is not None:
        out.append(
            f"- No bug: on every call of seeds {summ['checked_seeds']} both presets' outputs equal an attention "
            "rebuilt from `formats.fake_quantize` and `rotation.rotate` alone (`fake_quantize_attention`: Q, K "
            "E2M1 at 29/4 after the Hadamard, V and P~ E4M3 at 464 + 2**-15 for pv8, E2M1 for mxattention) "
            f"to {summ['check_max_abs']:.1e} (largest absolute difference)."
        )
    out += [
        f"- The error of the denoised map is mostly one number, a uniform offset of the whole map: it "
        f"carries {100 * share[MX4]:.0f} % (mxattention), {100 * share[PV8]:.0f} % (pv8) and "
        f"{100 * share[QK4]:.0f} % (P~, V exact) of the squared error (seed means), and "
        f"20 log10 |offset mx / offset pv8| follows the heightmap PSNR difference with Pearson r = "
        f"{summ['offset_prediction_r']:.2f}. Q, K in MXFP4 raise the map (offset > 0 with P~, V exact on "
        f"{summ['qk_offset_positive']} of {len(per)} seeds), in both presets alike; mxattention's MXFP4 P~V "
        f"adds an offset of its own, of the opposite sign on {summ['pv4_offset_opposes_qk']} of {len(per)} "
        "seeds. Where the two cancel, the larger attention error gives the closer map: seed "
        f"{w['seed']} ({summ['diff_db'][worst]:+.2f} dB; offsets mxattention {w[MX4]['offset']:+.2e}, pv8 "
        f"{w[PV8]['offset']:+.2e}, model units).{_inputs_sentence(per)} Not a bug, and not a sampler's chaos "
        "(one step): a property of this model's output error, which the metric reads.",
        f"- The paired difference is noise-dominated: over {allst['n']} seeds pv8 - mxattention is "
        f"{_fmt_stats(allst)}; a standard error of {allst['se_target']:.0f} dB needs about "
        f"{allst['seeds_for_se']} paired seeds.",
    ]
    out += [f"  Seeds {k.replace('_', ' ')}: {_fmt_stats(s)}." for k, s in st.items() if k != "all"]
    out += [
        f"- The ceiling of the P~V precision: P~, V exact over mxattention is {_fmt_stats(ceil, 'P~V exact')}; "
        f"pv8 is {pe['mean']:+.2f} +- {pe['se']:.2f} dB from it. With the seeds' mean squared error pooled "
        f"(PSNR of the mean MSE): mxattention {pooled[MX4]:.2f}, pv8 {pooled[PV8]:.2f}, P~V exact "
        f"{pooled[QK4]:.2f} dB ({pooled[PV8] - pooled[MX4]:+.2f} dB pv8 over mxattention).",
    ]
    return out


def _inputs_sentence(per: Sequence[dict[str, Any]]) -> str:
    traced = [r for r in per if "input_rel_l2" in r[MX4]]
    if not traced:
        return ""
    parts = [
        f"seed {r['seed']} at {sum(b < a for a, b in zip(r[MX4]['input_rel_l2'], r[PV8]['input_rel_l2'], strict=True))}"
        f" of {len(r[MX4]['input_rel_l2'])}"
        for r in traced
    ]
    return (
        " pv8's attention inputs (the hidden state each call sees) are the closer to fp's on "
        + ", ".join(parts)
        + " calls."
    )


def render_markdown(res: dict[str, Any]) -> str:
    """ladder_trace.md of a run's result `res` (`run`'s: per_seed, summary, meta)."""
    meta, summ, per = res["meta"], res["summary"], res["per_seed"]
    lines = [
        "# Is the missed +6 dB real? `mxattention-pv8` against `mxattention` on the terrain UNet, seed by seed",
        "",
        f"{meta['date']}, {meta['machine']}, torch {meta['torch']}. Command: `{meta['command']}` "
        f"({meta['seconds']:.0f} s). Heightmap PSNR against fp as in ladder.md; the sampler is one "
        "denoising step, so the trajectory is the UNet's 28 attention calls of one forward pass.",
        "",
        "## Conclusion",
        "",
        *conclusion(res),
        "",
        "![per-call error and per-seed difference](ladder_trace.png)",
        "",
        "## Per seed",
        "",
        "PSNR in dB; offset: the mean of (map - fp map) in model units (the map spans about [-1, 1]); "
        "share: offset**2 / mean squared error; P~V exact: `pv8-pv-fp32`.",
        "",
        "| seed | PSNR mxattention | PSNR pv8 | PSNR P~V exact | pv8 - mx dB | offset mx | offset pv8 | "
        "offset P~V exact | share mx | share pv8 | mean call rel-L2 mx / pv8 |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r, d in zip(per, summ["diff_db"], strict=True):
        a, b, c = r[MX4], r[PV8], r[QK4]
        lines.append(
            f"| {r['seed']} | {a['psnr_db']:.2f} | {b['psnr_db']:.2f} | {c['psnr_db']:.2f} | {d:+.2f} | "
            f"{a['offset']:+.2e} | {b['offset']:+.2e} | {c['offset']:+.2e} | {a['offset_share']:.2f} | "
            f"{b['offset_share']:.2f} | {statistics.fmean(a['call_rel_l2']):.4f} / "
            f"{statistics.fmean(b['call_rel_l2']):.4f} |"
        )
    traced = [r for r in per if "split" in r]
    if traced:
        lines += [
            "",
            "## Per attention call, by operand",
            "",
            "rel-L2 against the exact attention of the same inputs, on mxattention's forward pass; each "
            "split column quantizes that operand pair alone. Mean over the 28 calls (max in brackets).",
            "",
            "| seed | mxattention | pv8 | " + " | ".join(SPLIT) + " |",
            "| ---: | --- | --- |" + " --- |" * len(SPLIT),
        ]

        def cell(xs: Sequence[float]) -> str:
            return f"{statistics.fmean(xs):.4f} ({max(xs):.4f})"

        for r in traced:
            lines.append(
                f"| {r['seed']} | {cell(r[MX4]['call_rel_l2'])} | {cell(r[PV8]['call_rel_l2'])} | "
                + " | ".join(cell(r["split"][n]) for n in SPLIT)
                + " |"
            )
    return "\n".join(lines) + "\n"


def plot(res: dict[str, Any], path: Path) -> None:
    """Left: per-call rel-L2 of both presets on the traced seeds. Right: pv8 - mxattention PSNR per
    seed, the mean with its standard error, and the +6 dB target."""
    from matplotlib.figure import Figure

    per, summ = res["per_seed"], res["summary"]
    fig = Figure(figsize=(15, 4.4), layout="constrained")
    ax, bx, cx = fig.subplots(1, 3, width_ratios=[1.3, 1, 0.8])
    colors = ["tab:blue", "tab:red", "tab:green", "tab:purple"]
    for r, c in zip([r for r in per if "split" in r], colors, strict=False):
        x = range(len(r[MX4]["call_rel_l2"]))
        ax.plot(x, r[MX4]["call_rel_l2"], "-", color=c, label=f"seed {r['seed']} mxattention")
        ax.plot(x, r[PV8]["call_rel_l2"], "--", color=c, label=f"seed {r['seed']} mxattention-pv8")
        ax.plot(
            x, r["split"]["P~, V MXFP4 (UOS, PNQ)"], ":", color=c, label=f"seed {r['seed']} P~, V MXFP4 alone"
        )
    ax.set_xlabel("attention call (UNet call order)")
    ax.set_ylabel("rel-L2 vs exact attention, same inputs")
    shown = [str(r["seed"]) for r in per if "split" in r][: len(colors)]
    ax.set_title(f"per call, seed(s) {', '.join(shown)}: pv8 (dashed) keeps Q, K's error")
    ax.legend(fontsize=7)
    s = summ["stats"]["all"]
    seeds = [r["seed"] for r in per]
    bx.bar(seeds, summ["diff_db"], color=["tab:green" if d > 0 else "tab:red" for d in summ["diff_db"]])
    bx.axhline(6.0, color="k", ls="--", lw=1, label="issue 16 target +6 dB")
    bx.axhspan(s["mean"] - s["se"], s["mean"] + s["se"], color="tab:blue", alpha=0.25)
    bx.axhline(s["mean"], color="tab:blue", lw=1.5, label=f"mean {s['mean']:+.2f} +- {s['se']:.2f} dB (SE)")
    bx.set_xticks(seeds if len(seeds) <= 16 else seeds[:: -(-len(seeds) // 16)])
    bx.set_xlabel("seed")
    bx.set_ylabel("PSNR pv8 - mxattention (dB)")
    bx.set_title(f"{s['n']} paired seeds: sd {s['sd']:.1f} dB per seed")
    bx.legend(fontsize=8)
    pred = summ["offset_predicted_db"]
    cx.scatter(pred, summ["diff_db"], s=14)
    lo, hi = min(*pred, *summ["diff_db"]), max(*pred, *summ["diff_db"])
    cx.plot([lo, hi], [lo, hi], "k:", lw=1)
    cx.set_xlabel("20 log10 |offset mx / offset pv8| (dB)")
    cx.set_ylabel("PSNR pv8 - mxattention (dB)")
    cx.set_title(f"uniform offset decides it (r = {summ['offset_prediction_r']:.2f})")
    fig.suptitle(
        "pv8's per-call attention error is lower everywhere; the heightmap PSNR gain follows one scalar, the "
        "map's uniform offset, whose Q, K and P~V parts cancel on some seeds: a noisy estimate per seed",
        fontsize=10,
    )
    fig.savefig(path, dpi=110)


def run(out: Path, seeds: Sequence[int], trace_seeds: Sequence[int], argv: Sequence[str] = ()) -> dict:
    """Trace every seed (`trace_seed`; the per-operand split on those also in `trace_seeds`),
    summarize, and write ladder_trace.json / .md / .png under `out`; returns the result."""
    t0 = time.perf_counter()
    per = [trace_seed(s, split=s in trace_seeds) for s in seeds]
    res: dict[str, Any] = {"per_seed": per, "summary": summarize(per)}
    res["meta"] = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()} CPU, {torch.get_num_threads()} torch thread(s)"
        if not torch.cuda.is_available()
        else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": ("python benchmarks/ladder_trace.py " + " ".join(argv)).strip(),
        "seconds": time.perf_counter() - t0,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "ladder_trace.json").write_text(json.dumps(res, indent=1))
    (out / "ladder_trace.md").write_text(render_markdown(res))
    plot(res, out / "ladder_trace.png")
    return res


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); bad arguments exit 2 with one line."""
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(
        prog="python benchmarks/ladder_trace.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out", type=Path, default=Path("docs/results/ladder"), help="default docs/results/ladder"
    )
    p.add_argument(
        "--seeds", type=int, nargs="+", default=list(range(8)), help="terrain seeds (default 0..7)"
    )
    p.add_argument(
        "--trace-seeds",
        type=int,
        nargs="*",
        default=[0, 3],
        help="seeds with the per-operand split (default 0 3)",
    )
    p.add_argument(
        "--render-only",
        action="store_true",
        help="run nothing: recompute the summary of --out/ladder_trace.json, rewrite it, the .md and the .png",
    )
    args = p.parse_args(argv)
    if args.render_only:
        src = args.out / "ladder_trace.json"
        if not src.is_file():
            p.error(f"--render-only: {src} does not exist")
        res = json.loads(src.read_text())
        res["summary"] = summarize(res["per_seed"])  # the summary is derived: refresh it
        src.write_text(json.dumps(res, indent=1))
        (args.out / "ladder_trace.md").write_text(render_markdown(res))
        plot(res, args.out / "ladder_trace.png")
        print((args.out / "ladder_trace.md").read_text())
        return 0
    if len(args.seeds) < 2 or any(s < 0 for s in args.seeds) or len(set(args.seeds)) != len(args.seeds):
        p.error("--seeds: at least 2 distinct seeds >= 0")
    if not set(args.trace_seeds) <= set(args.seeds):  # else silently not traced
        p.error(f"--trace-seeds {args.trace_seeds} must be among --seeds {args.seeds}")
    run(args.out, args.seeds, args.trace_seeds, argv)
    print((args.out / "ladder_trace.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
