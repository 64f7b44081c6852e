"""The precision-ladder study (issue 16): presets and the ablation of each new piece, and the q sweep per ladder.

    python benchmarks/ladder.py [--out docs/results/ladder] [--texts 16] [--seeds 0 1 2 3]

For every preset and every configuration of `ABLATIONS` (each takes one piece off or adds one to
`mxattention-pv8` / `mxattention-pv8-smooth`): terrain-UNet heightmap PSNR / SSIM against fp (paired
seeds) and the mean attention-output rel-L2 of its 28 layers, MiniLM embedding cosine to fp and its
6 layers' rel-L2, and the rel-L2 on a synthetic DiT-like case (`dit_like_qkv`). Then, on the real
Q, K, V of both models, the MSE-optimal ceil boundary q of each tensor for each element ladder
(`ladder_q_grid`: 41 points from the ladder's max to 2**(emax+1)) against the ladder's UOS boundary
from `mxattention.theory`. Writes `ladder.json` (every number) and `ladder.md` (the tables) under --out.
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
from pathlib import Path

import torch

from mxattention.attention.config import PRESETS, AttentionConfig, QuantSpec
from mxattention.eval.diagnostics import method_errors
from mxattention.eval.diagnostics.qsweep import ladder_q_grid, q_sweep
from mxattention.eval.study import attn_fn_for, heightmap_quality
from mxattention.formats.ladders import LADDERS
from mxattention.theory import optimal_boundary

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ladder_trace import paired_stats  # benchmarks/ladder_trace.py


def _ablations() -> dict[str, AttentionConfig]:
    pv8, smooth, mx8 = PRESETS["mxattention-pv8"], PRESETS["mxattention-pv8-smooth"], PRESETS["mxfp8"]
    e4m3_ocp = QuantSpec("mxfp8_e4m3", "ocp")

    def var(base: AttentionConfig, name: str, notes: str, **changes) -> AttentionConfig:
        return dataclasses.replace(base, name=name, notes=notes, **changes)

    cfgs = [
        var(
            pv8,
            "pv8-pv-ocp-direct",
            "P~, V E4M3 OCP floor rule, no PNQ (the MX peers' P~V)",
            v=e4m3_ocp,
            p=e4m3_ocp,
            pnq=False,
        ),
        var(pv8, "pv8-pv-ocp", "P~, V E4M3 OCP floor rule, PNQ (w/o UOS on P~V)", v=e4m3_ocp, p=e4m3_ocp),
        var(pv8, "pv8-direct", "P~, V E4M3 UOS, no PNQ (w/o PNQ)", pnq=False),
        var(pv8, "pv8-pv-fp32", "P~, V in fp32 (the ceiling of an 8-bit P~V)", v=None, p=None),
        var(pv8, "pv8-no-hadamard", "w/o the Hadamard", hadamard=False),
        var(pv8, "pv8-smooth-k", "+ K smoothing (token mean)", smooth_k=True),
        var(smooth, "pv8-smooth-qk", "mxattention-pv8-smooth + K smoothing", smooth_k=True),
        var(smooth, "pv8-smooth-no-hadamard", "mxattention-pv8-smooth w/o the Hadamard", hadamard=False),
        var(PRESETS["mxattention"], "mxattention-smooth", "mxattention + Q smoothing", smooth_q=True),
        var(mx8, "mxfp8-smooth", "mxfp8 + Q smoothing", smooth_q=True),
        AttentionConfig(
            "mxfp8-ocp-direct",
            e4m3_ocp,
            e4m3_ocp,
            e4m3_ocp,
            e4m3_ocp,
            notes="OCP MXFP8 E4M3, no rotation, no PNQ",
        ),
    ]
    return {c.name: c for c in cfgs}


ABLATIONS: dict[str, AttentionConfig] = _ablations()

# Each new piece as (what it is, the method with it, the same method without it).
PIECES: tuple[tuple[str, str, str], ...] = (
    ("P~, V in MXFP8 E4M3 instead of MXFP4", "mxattention-pv8", "mxattention"),
    ("E4M3's UOS boundary for P~, V instead of OCP's floor (PNQ on)", "mxattention-pv8", "pv8-pv-ocp"),
    ("PNQ with an MXFP8 P~ (UOS on)", "mxattention-pv8", "pv8-direct"),
    ("UOS + PNQ on P~V against the MX peers' OCP, direct P~V", "mxattention-pv8", "pv8-pv-ocp-direct"),
    ("fp32 P~V instead of MXFP8 (what 8 bits leave)", "pv8-pv-fp32", "mxattention-pv8"),
    ("Hadamard, with an MXFP8 P~V", "mxattention-pv8", "pv8-no-hadamard"),
    ("Q smoothing (before the Hadamard) on mxattention-pv8", "mxattention-pv8-smooth", "mxattention-pv8"),
    ("Hadamard, after Q smoothing", "mxattention-pv8-smooth", "pv8-smooth-no-hadamard"),
    ("K smoothing on mxattention-pv8", "pv8-smooth-k", "mxattention-pv8"),
    ("K smoothing on mxattention-pv8-smooth", "pv8-smooth-qk", "mxattention-pv8-smooth"),
    ("Q smoothing on the fully 4-bit mxattention", "mxattention-smooth", "mxattention"),
    ("Q smoothing on mxfp8", "mxfp8-smooth", "mxfp8"),
    ("Hadamard + UOS + PNQ on MXFP8 against plain OCP MXFP8", "mxfp8", "mxfp8-ocp-direct"),
)


def ladder_methods() -> dict[str, AttentionConfig]:
    """Every preset, then every ablation, by name."""
    return {**PRESETS, **ABLATIONS}


def dit_like_qkv(seed: int, b: int = 1, h: int = 4, lq: int = 1000, lk: int = 1000, d: int = 128):
    """Synthetic DiT-like Q, K, V [B, H, L, D] (L not a multiple of the tiles): N(0, 1) activations with 4
    shared outlier channels of Q and K (x 6) and per-channel offsets in Q (N(0, 1)), K (N(0, 2**2))
    and V (N(0, 0.5**2)), the channel structure SageAttention reports in video DiTs."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g) + torch.randn(h, 1, d, generator=g)
    k = torch.randn(b, h, lk, d, generator=g) + 2.0 * torch.randn(h, 1, d, generator=g)
    v = torch.randn(b, h, lk, d, generator=g) + 0.5 * torch.randn(h, 1, d, generator=g)
    ch = torch.randperm(d, generator=g)[:4]
    q[..., ch] *= 6.0
    k[..., ch] *= 6.0
    return q, k, v


def _mean_layer_error(layers, methods: dict[str, AttentionConfig]) -> dict[str, float]:
    per: dict[str, list[float]] = {m: [] for m in methods}
    for lay in layers:
        for r in method_errors(
            lay.q, lay.k, lay.v, list(methods.values()), attn_mask=lay.attn_mask, scale=lay.scale
        ):
            per[r.method].append(r.rel_l2)
    return {m: statistics.fmean(e) for m, e in per.items()}


def terrain(methods: dict[str, AttentionConfig], seeds: Sequence[int]) -> tuple[dict, list]:
    from mxattention.eval.models.terrain import capture_terrain_qkv, generate_heightmaps

    layers = capture_terrain_qkv(seeds[:1])
    ref = generate_heightmaps(seeds, attn_fn=attn_fn_for("fp"))
    quality = {
        m: heightmap_quality(generate_heightmaps(seeds, attn_fn=attn_fn_for(c)), ref)
        for m, c in methods.items()
    }
    return {
        "seeds": list(seeds),
        "quality": quality,
        "layer_rel_l2": _mean_layer_error(layers, methods),
    }, layers


def minilm(methods: dict[str, AttentionConfig], n_texts: int) -> tuple[dict, list]:
    from mxattention.eval.models.minilm import MiniLMRunner, sample_texts

    runner = MiniLMRunner(sample_texts(n_texts, seed=0))
    layers = runner.capture()
    ref = runner.embed(attn_fn_for("fp"))
    cos = {
        m: float(torch.nn.functional.cosine_similarity(runner.embed(attn_fn_for(c)), ref, dim=1).mean())
        for m, c in methods.items()
    }
    return {
        "texts": n_texts,
        "embedding_cosine": cos,
        "layer_rel_l2": _mean_layer_error(layers, methods),
    }, layers


def dit_like(methods: dict[str, AttentionConfig], seeds: Sequence[int] = (0, 1, 2)) -> dict:
    errs: dict[str, list[float]] = {m: [] for m in methods}
    for s in seeds:
        q, k, v = dit_like_qkv(s)
        for r in method_errors(q, k, v, list(methods.values())):
            errs[r.method].append(r.rel_l2)
    return {
        "seeds": list(seeds),
        "shape": list(dit_like_qkv(0)[0].shape),
        "rel_l2": {m: statistics.fmean(e) for m, e in errs.items()},
    }


def _sweep_row(sweep, nearest: float, step: float) -> dict:
    """One tensor's sweep read against q*: the grid points of least MSE (E4M3 / E5M2 have a flat stretch
    below q*: a scale twice as large gives the same floating-point relative grid, and the block maximum
    in (max, q*] saturates to the same value either way), where q*'s grid point lies from them (0: it is
    one of them), and how much the MSE rises one step above q*."""
    best = min(sweep.mse)
    ties = [g for g, m in zip(sweep.grid, sweep.mse, strict=True) if m <= best * (1 + 1e-6)]
    offset = 0 if nearest in ties else round((min(ties, key=lambda g: abs(g - nearest)) - nearest) / step)
    above = next((m for g, m in zip(sweep.grid, sweep.mse, strict=True) if g > nearest), sweep.mse[-1])
    return {
        "best_q": [ties[0], ties[-1]],
        "offset_steps": offset,
        "uos_gap": sweep.uos_gap,
        "ocp_over_uos": sweep.mse_ocp / sweep.mse_uos,
        "rise_one_step_above": above / sweep.mse_uos - 1,
    }


def ladder_sweeps(layers) -> dict[str, dict]:
    """Per ladder and tensor (Q, K along the head dim, V along the tokens), one `_sweep_row` per layer."""
    out: dict[str, dict] = {}
    for elem in LADDERS:
        grid = ladder_q_grid(elem)
        q_star = optimal_boundary(elem)
        step = grid[1] - grid[0]
        nearest = min(grid, key=lambda g: abs(g - q_star))
        tensors = {}
        for name, axis in (("Q", -1), ("K", -1), ("V", -2)):
            rows = [
                _sweep_row(q_sweep(getattr(lay, name.lower()), axis, grid, elem=elem), nearest, step)
                for lay in layers
            ]
            tensors[name] = {key: [r[key] for r in rows] for key in rows[0]}
        out[elem] = {"q_star": q_star, "grid_step": step, "nearest_grid_q": nearest, "tensors": tensors}
    return out


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]


def _bins(offsets: list[int]) -> list[str]:
    n = max(1, len(offsets))
    share = [
        sum(o <= -2 for o in offsets),
        sum(o == -1 for o in offsets),
        sum(o == 0 for o in offsets),
        sum(o == 1 for o in offsets),
        sum(o >= 2 for o in offsets),
    ]
    return [f"{100 * c / n:.0f}" for c in share]


def _paired(t: dict, a: str, b: str) -> list[float]:
    """Per-seed terrain PSNR differences a - b (dB)."""
    qa, qb = t["quality"][a]["psnr_per_seed"], t["quality"][b]["psnr_per_seed"]
    return [x - y for x, y in zip(qa, qb, strict=True)]


def _se(diffs: Sequence[float]) -> str:
    """' +- SE' of paired differences (sd / sqrt(n)); empty below 2 finite ones (fp's inf PSNR has none)."""
    if len(diffs) < 2 or not all(math.isfinite(d) for d in diffs):
        return ""
    return f" +- {paired_stats(diffs)['se']:.2f}"


def render_markdown(res: dict) -> str:
    meta, t, m, dit = res["meta"], res["terrain"], res["minilm"], res["dit_like"]
    methods = list(t["quality"])
    out = [
        "# The precision ladder: MXFP4 QK^T with MXFP8 P~V, UOS and PNQ on every ladder, Q smoothing",
        "",
        f"{meta['date']}, {meta['machine']}, torch {meta['torch']}. Command: `{meta['command']}` "
        f"({meta['seconds']:.0f} s).",
        "",
        f"Terrain UNet: heightmap PSNR (dB) / SSIM against fp, seeds {t['seeds']} paired; layer rel-L2 is the "
        "mean over its 28 attention layers (seed 0's Q, K, V). MiniLM-L6: embedding cosine to fp over "
        f"{m['texts']} sentences, mean rel-L2 of its 6 layers. DiT-like: rel-L2 of the attention output, "
        f"{dit['shape']} ({len(dit['seeds'])} seeds; `dit_like_qkv`). All against the fp method.",
        "",
    ]
    rows = []
    for name in methods:
        q = t["quality"][name]
        rows.append(
            [
                f"`{name}`",
                res["notes"][name],
                f"{q['psnr_db']:.2f} ({', '.join(f'{x:.1f}' for x in q['psnr_per_seed'])})",
                f"{q['ssim']:.4f}",
                f"{t['layer_rel_l2'][name]:.4f}",
                f"{m['embedding_cosine'][name]:.5f}",
                f"{m['layer_rel_l2'][name]:.4f}",
                f"{dit['rel_l2'][name]:.4f}",
            ]
        )
    out += _table(
        [
            "method",
            "what",
            "terrain PSNR dB (per seed)",
            "terrain SSIM",
            "terrain layer rel-L2",
            "MiniLM cosine",
            "MiniLM layer rel-L2",
            "DiT-like rel-L2",
        ],
        rows,
    )
    psnr = {n: t["quality"][n]["psnr_db"] for n in methods}
    cos = m["embedding_cosine"]
    pieces = [p for p in PIECES if {p[1], p[2]} <= set(methods)]
    if pieces:
        out += [
            "",
            "## Each new piece: with against without",
            "",
            "Terrain: PSNR difference (dB, mean over the seeds +- the standard error of the paired per-seed "
            "differences, with two or more seeds; per seed in brackets); MiniLM: embedding cosine to fp; "
            "DiT-like: rel-L2. `helps` says where the piece is better (T terrain, M MiniLM, D DiT-like).",
            "",
        ]
        rows = []
        for what, with_, without in pieces:
            d_seed = [
                a - b
                for a, b in zip(
                    t["quality"][with_]["psnr_per_seed"], t["quality"][without]["psnr_per_seed"], strict=True
                )
            ]
            better = {
                "T": psnr[with_] > psnr[without],
                "M": cos[with_] > cos[without],
                "D": dit["rel_l2"][with_] < dit["rel_l2"][without],
            }
            helps = "".join(k for k, v in better.items() if v)
            rows.append(
                [
                    what,
                    f"`{with_}` vs `{without}`",
                    f"{psnr[with_] - psnr[without]:+.2f}{_se(d_seed)} ({', '.join(f'{d:+.1f}' for d in d_seed)})",
                    f"{cos[with_]:.6f} / {cos[without]:.6f}",
                    f"{dit['rel_l2'][with_]:.4f} / {dit['rel_l2'][without]:.4f}",
                    "all" if len(helps) == 3 else (helps or "none"),
                ]
            )
        out += _table(
            ["piece", "with vs without", "terrain dB", "MiniLM cosine", "DiT-like rel-L2", "helps"], rows
        )
    if {"mxattention-pv8", "mxattention-pv8-smooth", "nvfp4-sage", "mxattention"} <= set(methods):
        out += [
            "",
            "Targets (issue 16):",
            "",
            f"- `mxattention-pv8` over `mxattention` on terrain: {psnr['mxattention-pv8'] - psnr['mxattention']:+.2f}"
            f"{_se(_paired(t, 'mxattention-pv8', 'mxattention'))} dB (target >= +6 dB); this difference moves by "
            "several dB from seed to seed: ladder_trace.md (`python benchmarks/ladder_trace.py`) measures "
            "it on more seeds and says why.",
            f"- `mxattention-pv8-smooth` against `nvfp4-sage` on terrain: "
            f"{psnr['mxattention-pv8-smooth'] - psnr['nvfp4-sage']:+.2f}"
            f"{_se(_paired(t, 'mxattention-pv8-smooth', 'nvfp4-sage'))} dB (target >= -2 dB); on MiniLM: cosine "
            f"{cos['mxattention-pv8-smooth']:.5f} vs {cos['nvfp4-sage']:.5f} (target: above).",
        ]
    out += [
        "",
        "## q sweep per ladder on real Q, K, V",
        "",
        "For each layer's Q, K (blocks along the head dim) and V (along the tokens) of both models "
        "(terrain 28 layers, MiniLM 6), the ceil boundary q of least MSE on the ladder's grid (41 points from "
        "its max to 2**(emax+1)), binned by its distance in grid steps from the grid point nearest the "
        "theory's q* to the nearest grid point of least MSE (percent of tensors; 0: q* is a point of least "
        "MSE, ties included: E4M3, E5M2 and E3M2 are flat from their max up to q*, since doubling the scale keeps "
        "a floating-point ladder's relative grid and the saturated maximum lands on the same value). "
        "`UOS gap`: mean of MSE(q*) / MSE(best q) - 1; `rise above q*`: mean of MSE(one step above q*) / "
        "MSE(q*) - 1; `OCP / UOS`: mean MSE ratio of the floor rule to q*.",
        "",
    ]
    rows = []
    for elem, sw in res["sweeps"].items():
        for name, tv in sw["tensors"].items():
            rows.append(
                [
                    elem,
                    f"{sw['q_star']:.6g}",
                    f"{sw['grid_step']:.4g}",
                    name,
                    *_bins(tv["offset_steps"]),
                    f"{100 * statistics.fmean(tv['uos_gap']):.3f} %",
                    f"{100 * statistics.fmean(tv['rise_one_step_above']):+.3f} %",
                    f"{statistics.fmean(tv['ocp_over_uos']):.3f}",
                ]
            )
    out += _table(
        [
            "ladder",
            "q*",
            "step",
            "tensor",
            "<= -2",
            "-1",
            "0",
            "+1",
            ">= +2",
            "UOS gap",
            "rise above q*",
            "OCP / UOS",
        ],
        rows,
    )
    return "\n".join(out) + "\n"


def run(
    out: Path,
    n_texts: int = 16,
    seeds: Sequence[int] = (0, 1, 2, 3),
    methods: Sequence[str] | None = None,
    argv: Sequence[str] = (),
) -> dict:
    t0 = time.perf_counter()
    allm = ladder_methods()
    chosen = {n: allm[n] for n in (methods or allm)}
    terr, t_layers = terrain(chosen, seeds)
    mini, m_layers = minilm(chosen, n_texts)
    res = {
        "terrain": terr,
        "minilm": mini,
        "dit_like": dit_like(chosen),
        "sweeps": ladder_sweeps([*t_layers, *m_layers]),
        "notes": {n: c.notes or c.describe() for n, c in chosen.items()},
        "configs": {n: c.to_dict() for n, c in chosen.items()},
    }
    res["meta"] = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()} CPU, {torch.get_num_threads()} torch threads"
        if not torch.cuda.is_available()
        else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": ("python benchmarks/ladder.py " + " ".join(argv)).strip(),
        "seconds": time.perf_counter() - t0,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "ladder.json").write_text(json.dumps(res, indent=1))
    (out / "ladder.md").write_text(render_markdown(res))
    return res


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(
        prog="python benchmarks/ladder.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("docs/results/ladder"),
        help="output folder (default docs/results/ladder)",
    )
    p.add_argument("--texts", type=int, default=16, help="MiniLM sentences (default 16)")
    p.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1, 2, 3], help="terrain seeds (default 0 1 2 3)"
    )
    p.add_argument(
        "--methods",
        nargs="+",
        default=None,
        choices=list(ladder_methods()),
        help="default: every preset and ablation",
    )
    args = p.parse_args(argv)
    if args.texts < 1 or any(s < 0 for s in args.seeds):
        p.error("--texts must be >= 1 and --seeds >= 0")
    run(args.out, args.texts, args.seeds, args.methods, argv)
    print((args.out / "ladder.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
