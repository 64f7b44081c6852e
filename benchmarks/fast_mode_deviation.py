"""The fast mode's deviation from the exact method, measured on the CPU (issue 29, docs/fast_mode.md).

Run from the repository root: `PYTHONPATH=src:. python benchmarks/fast_mode_deviation.py [--out DIR]`
(default DIR benchmarks/results; a few minutes on 2 cores). For each input set (random, outlier-heavy,
DiT-like synthetic Q/K/V and every attention call of the terrain model and of MiniLM, captured as
`eval.study` captures them), with `attention.reference` (the fast mode's emulation, which the FP8
kernel equals on the interpreter):

- dev = rel-L2(O_fast, O_exact) / rel-L2(O_exact, O_fp32): the fast mode's deviation as a share of the
  method's own error (issue 29's bound: <= 2 %), worst and mean over calls;
- the induced weights' largest |row sum - 1| (V = identity, so O's rows are the weights the method
  applies: the folded P~ over the l it divides by);
- the elements, MX blocks and anchor groups (Q^ rows, K^ heads, V^ columns) outside the exact fold,
  and the K^ blocks a per-key anchor would leave outside (what it would save over the per-head one).

Writes DIR/fast_mode_deviation.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from mxattention.attention.config import get_method
from mxattention.attention.fast import fold_report
from mxattention.attention.operands import prepare_operands
from mxattention.attention.reference import reference_attention

FAST, EXACT, FP = get_method("mxattention-fast"), get_method("mxattention"), get_method("fp")
BOUND = 0.02


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def synthetic(kind: str, seed: int = 0, b: int = 1, h: int = 4, lq: int = 500, lk: int = 700, d: int = 128):
    """(name, q, k, v, mask, scale): "random" Gaussian; "outliers" per-token magnitudes over
    2**[-12, 12] on Q, K, V (blocks and rows outside the fold); "dit" channel outliers (4 channels x 20)
    and per-channel offsets on Q, K, V."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=g) for n in (lq, lk, lk))
    if kind == "outliers":
        q, k, v = (x * torch.exp2(24 * torch.rand(*x.shape[:-1], 1, generator=g) - 12) for x in (q, k, v))
    elif kind == "dit":
        chan = torch.ones(d)
        chan[torch.randperm(d, generator=g)[:4]] = 20.0
        q = q * chan + 3.0 * torch.randn(d, generator=g)
        k = k * chan + 3.0 * torch.randn(d, generator=g)
        v = v * torch.exp(0.5 * torch.randn(d, generator=g)) + torch.randn(d, generator=g)
    return q, k, v, None, d**-0.5


def _fast_with_p_counts(q, k, v, kw) -> tuple[torch.Tensor, dict]:
    """reference_attention of the fast mode, counting the P~ MX blocks (32 keys) whose folded values
    differ from the exact Q(P~), the nonzero blocks, and the query rows with any such block."""
    import mxattention.attention.reference as ref_module
    from mxattention.attention.operands import quantize

    original = ref_module.quantize_p
    counts = {"blocks": 0, "nonzero_blocks": 0, "rows": 0, "rows_total": q.shape[:-1].numel()}
    bad_rows = []

    def counting(p_tilde, cfg):
        p = original(p_tilde, cfg)
        exact = quantize(p_tilde, cfg.p, -1)
        pad = (-p.shape[-1]) % 32
        diff = torch.nn.functional.pad(p != exact, (0, pad)).unflatten(-1, (-1, 32)).any(-1)
        counts["blocks"] += int(diff.sum())
        counts["nonzero_blocks"] += int(
            torch.nn.functional.pad(exact, (0, pad)).unflatten(-1, (-1, 32)).amax(-1).gt(0).sum()
        )
        bad_rows.append(diff.any(-1))
        return p

    ref_module.quantize_p = counting
    try:
        out, _ = reference_attention(q, k, v, FAST, **kw)
    finally:
        ref_module.quantize_p = original
    # The reference ran every row at once here (its tile budget is far above these calls), so each
    # tile covers all rows: a row is outside if any of its tiles is.
    rows = torch.zeros(q.shape[:-1], dtype=torch.bool)
    for t in bad_rows:
        assert t.shape == rows.shape, (t.shape, rows.shape)
        rows |= t
    counts["rows"] = int(rows.sum())
    return out, counts


def measure(q, k, v, mask, scale, is_causal=False) -> dict:
    """The deviation numbers of one call (see the module doc)."""
    kw = dict(mask=mask, is_causal=is_causal, scale=scale)
    fast, p_counts = _fast_with_p_counts(q, k, v, kw)
    exact, _ = reference_attention(q, k, v, EXACT, **kw)
    fp, _ = reference_attention(q, k, v, FP, **kw)
    own = _rel(exact, fp)
    lk = k.shape[-2]
    eye = torch.eye(lk).expand(*k.shape[:-1], lk)
    w, _ = reference_attention(q, k, eye, FAST, **kw)
    rows = w.sum(-1)
    has_keys = rows != 0  # rows with no key to attend (masks) have O = 0
    ops = prepare_operands(q, k, v, EXACT)
    return {
        "dev_of_own_error": _rel(fast, exact) / max(own, 1e-300),
        "fast_vs_exact": _rel(fast, exact),
        "exact_vs_fp32": own,
        "fast_vs_fp32": _rel(fast, fp),
        "max_abs_row_sum_minus_1": (rows[has_keys] - 1).abs().max().item() if has_keys.any() else 0.0,
        "outside": fold_report(ops.q, ops.k, ops.v) | {"p": p_counts},
    }


def _sum_reports(reports: list[dict]) -> dict:
    out: dict = {}
    for r in reports:
        for op, counts in r.items():
            for key, n in counts.items():
                out.setdefault(op, {}).setdefault(key, 0)
                out[op][key] += n
    return out


def summarize(name: str, rows: list[dict]) -> dict:
    devs = [r["dev_of_own_error"] for r in rows]
    return {
        "set": name,
        "calls": len(rows),
        "dev_of_own_error_max": max(devs),
        "dev_of_own_error_mean": sum(devs) / len(devs),
        "exact_vs_fp32_mean": sum(r["exact_vs_fp32"] for r in rows) / len(rows),
        "max_abs_row_sum_minus_1": max(r["max_abs_row_sum_minus_1"] for r in rows),
        "outside": _sum_reports([r["outside"] for r in rows]),
        "k_heads_outside": sum(r["outside"]["k"]["groups"] for r in rows),
        "k_heads": sum(r["outside"]["k"]["groups_total"] for r in rows),
        "ok": max(devs) <= BOUND,
    }


def captures(n_texts: int, log) -> dict[str, list]:
    """The attention calls of the terrain model (seed 0) and of MiniLM (`n_texts` sample texts)."""
    from mxattention.eval.models.minilm import MiniLMRunner, sample_texts
    from mxattention.eval.models.terrain import capture_terrain_qkv

    out = {}
    t = time.time()
    out["terrain"] = capture_terrain_qkv([0])
    log(f"terrain: {len(out['terrain'])} calls captured in {time.time() - t:.1f} s")
    t = time.time()
    out["minilm"] = MiniLMRunner(sample_texts(n_texts, seed=0)).capture()
    log(f"minilm: {len(out['minilm'])} calls captured in {time.time() - t:.1f} s")
    return out


def study(n_texts: int, seeds: list[int], log) -> dict:
    """The study's end-to-end quality (`eval.study`) of fp, mxattention and mxattention-fast: MiniLM's
    sentence-embedding cosine against fp (`n_texts` texts) and terrain's heightmap PSNR / SSIM against
    fp (`seeds`)."""
    from mxattention.eval.study import minilm_part, terrain_part

    methods = ["fp", "mxattention", "mxattention-fast"]
    t = time.time()
    m = minilm_part(methods, n_texts, show=False)
    log(f"study MiniLM in {time.time() - t:.0f} s: {m['embedding_cosine']}")
    t = time.time()
    r = terrain_part(methods, seeds, show=False)
    quality = {k: {"psnr_db": v["psnr_db"], "ssim": v["ssim"]} for k, v in r["heightmap_quality"].items()}
    log(f"study terrain in {time.time() - t:.0f} s: {quality}")
    return {
        "texts": n_texts,
        "seeds": seeds,
        "minilm_embedding_cosine": m["embedding_cosine"],
        "terrain_quality": quality,
    }


def markdown(report: dict) -> str:
    lines = [
        "# The fast mode's deviation from the exact method (CPU, the emulation)",
        "",
        f"`{report['command']}`",
        "",
        "dev = rel-L2(O_fast, O_exact) / rel-L2(O_exact, O_fp32) (bound 2 %); row sums of the induced weights "
        "(V = identity); blocks outside the exact fold (Q^ rows / K^ per head / V^ columns; K^ with a per-key "
        "anchor instead).",
        "",
        "| set | calls | dev max | dev mean | exact vs fp32 | max abs(row sum - 1) | Q^ blocks out | "
        "K^ blocks out (per key) | K^ heads out | V^ blocks out | P~ blocks changed (of nonzero) | rows with P~ changed |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in report["sets"]:
        o = s["outside"]
        lines.append(
            f"| {s['set']} | {s['calls']} | {100 * s['dev_of_own_error_max']:.3f} % | "
            f"{100 * s['dev_of_own_error_mean']:.4f} % | {s['exact_vs_fp32_mean']:.3f} | "
            f"{s['max_abs_row_sum_minus_1']:.1e} | {o['q']['blocks']} / {o['q']['blocks_total']} | "
            f"{o['k']['blocks']} ({o['k_per_key']['blocks']}) / {o['k']['blocks_total']} | "
            f"{s['k_heads_outside']} / {s['k_heads']} | {o['v']['blocks']} / {o['v']['blocks_total']} | "
            f"{o['p']['blocks']} / {o['p']['nonzero_blocks']} | {o['p']['rows']} / {o['p']['rows_total']} |"
        )
    st = report.get("study")
    if st:
        lines += [
            "",
            f"End to end (`eval.study`): MiniLM sentence-embedding cosine against fp ({st['texts']} texts), "
            f"terrain heightmaps against fp (seeds {st['seeds']}).",
            "",
            "| method | MiniLM cosine | terrain PSNR (dB) | terrain SSIM |",
            "| --- | ---: | ---: | ---: |",
        ]
        for name in ("mxattention", "mxattention-fast"):
            tq = st["terrain_quality"][name]
            cos = st["minilm_embedding_cosine"][name]
            lines.append(f"| `{name}` | {cos:.6f} | {tq['psnr_db']:.3f} | {tq['ssim']:.5f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--texts", type=int, default=8, help="MiniLM sample texts")
    ap.add_argument("--no-models", action="store_true", help="synthetic sets only")
    ap.add_argument(
        "--study",
        action="store_true",
        help="also the end-to-end study (MiniLM cosine, terrain PSNR; ~10 min)",
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3], help="terrain seeds of --study")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    sets = []
    for kind in ("random", "outliers", "dit"):
        rows = [measure(*synthetic(kind, seed=s)) for s in range(2)]
        sets.append(summarize(kind, rows))
        log(json.dumps(sets[-1])[:400])
    if not args.no_models:
        for name, layers in captures(args.texts, log).items():
            rows = [
                measure(
                    lay.q, lay.k, lay.v, lay.attn_mask, lay.scale or lay.q.shape[-1] ** -0.5, lay.is_causal
                )
                for lay in layers
            ]
            sets.append(summarize(name, rows))
            log(json.dumps(sets[-1])[:400])
    report = {
        "command": "python " + " ".join(["benchmarks/fast_mode_deviation.py", *sys.argv[1:]]),
        "sets": sets,
    }
    if args.study:
        report["study"] = study(args.texts, args.seeds, log)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fast_mode_deviation.json").write_text(json.dumps(report, indent=1))
    (args.out / "fast_mode_deviation.md").write_text(markdown(report))
    print(markdown(report))
    return 0 if all(s["ok"] for s in sets) else 1


if __name__ == "__main__":
    sys.exit(main())
