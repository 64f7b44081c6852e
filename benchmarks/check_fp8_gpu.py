"""GPU check of the fast mode (`mxattention-fast`, FP8 tensor cores; issue 29, docs/fast_mode.md).

Run from the repository root on a CUDA GPU with FP8 MMAs (sm_89+; built for the H200):

    PYTHONPATH=src:. python benchmarks/check_fp8_gpu.py --out DIR [--quick] [--rep-ms 200] [--warmup-s 5]

1. build: the FP8 wgmma kinds in the PTX of the kernel this GPU compiles, registers, spills.
2. correctness at several shapes (lengths that are not tile multiples, GQA, causal, masks, bf16,
   DiT-like and outlier-heavy inputs): the kernel against its emulation (`reference_attention` of
   mxattention-fast, on the GPU), against the exact method (kernel and reference), and every one
   against fp32 attention; differing folded-P~ decisions, lse, rows / blocks outside the exact fold;
   the kernel again with every FP8 k-step promoted to fp32 (`qk_acc = pv_acc = 32`), which isolates
   what Hopper's FP8 accumulator adds; the induced weights' row sums (V = identity).
3. speed in one process, after a cuDNN warm-up: cuDNN SDPA, the exact mxattention, the fast mode
   (whole call), its kernel alone on prepared operands in a few tile / accumulator variants, and its
   pre-pass + fold alone, at (1, 40, 16384, 16384, 128) and (1, 40, 32760, 512, 128) bf16.
   (P~'s E4M3 rounding by the hardware conversion where the plan takes it, sm_90; the software rounding
   as one more variant.)

Writes DIR/check_fp8_gpu.json (and prints a summary). Each section records its error instead of
stopping the run. Exits 1 if a hard check fails (the fast mode's deviation from the exact method over
2 % of the method's own error, non-finite outputs where the emulation is finite, row sums off by
more than 1e-3), 2 if a section raised.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

import torch

from mxattention.attention.config import get_method
from mxattention.attention.operands import prepare_operands
from mxattention.attention.reference import cast_output, reference_attention

FAST, EXACT, FP = get_method("mxattention-fast"), get_method("mxattention"), get_method("fp")
DEVIATION_OF_OWN_ERROR = 0.02  # issue 29: rel-L2(fast, exact) <= 2 % of rel-L2(exact, fp32)

# label, (B, Hq, Hkv, Lq, Lk, D), dtype, causal, mask ("", "keys", "additive"), data
CASES = [
    ("ragged-fp32", (1, 4, 4, 1000, 1333, 128), torch.float32, False, "", "outliers"),
    ("gqa-d64-causal-bf16", (2, 8, 2, 700, 900, 64), torch.bfloat16, True, "", "outliers"),
    ("key-mask-bf16", (1, 4, 4, 513, 777, 128), torch.bfloat16, False, "keys", "outliers"),
    ("additive-mask-d32", (1, 4, 4, 300, 333, 32), torch.float32, False, "additive", "outliers"),
    ("dit-like-4k-bf16", (1, 8, 8, 4096, 4096, 128), torch.bfloat16, False, "", "dit"),
    ("outlier-heavy-2k", (1, 4, 4, 2048, 2048, 128), torch.float32, False, "", "spread"),
    ("cross-4k-512-bf16", (1, 8, 8, 4096, 512, 128), torch.bfloat16, False, "", "dit"),
]
QUICK = {"ragged-fp32", "gqa-d64-causal-bf16", "key-mask-bf16", "outlier-heavy-2k"}
SPEED_SHAPES = {"16k": (40, 16384, 16384, 128), "cross-32k-512": (40, 32760, 512, 128)}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def inputs(shape, dtype, data: str, seed: int = 0):
    """Q, K, V on the GPU. "outliers": Gaussian with per-channel magnitudes exp(N(0, 1)) on Q, K and a
    K offset; "dit": DiT-like, channel outliers (a few channels x 20) and per-channel offsets on Q and
    K; "spread": per-token magnitudes over 2**[-10, 10] on Q, K, V (blocks outside the exact fold)."""
    b, hq, hk, lq, lk, d = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, hq, lq, d, device="cuda", generator=g)
    k = torch.randn(b, hk, lk, d, device="cuda", generator=g)
    v = torch.randn(b, hk, lk, d, device="cuda", generator=g)
    if data == "outliers":
        q = q * torch.exp(torch.randn(d, device="cuda", generator=g))
        k = k * torch.exp(torch.randn(d, device="cuda", generator=g)) + 2.0 * torch.randn(
            d, device="cuda", generator=g
        )
    elif data == "dit":
        chan = torch.ones(d, device="cuda")
        chan[torch.randperm(d, device="cuda", generator=g)[:4]] = 20.0
        q = q * chan + 3.0 * torch.randn(d, device="cuda", generator=g)
        k = k * chan + 3.0 * torch.randn(d, device="cuda", generator=g)
        v = v * torch.exp(0.5 * torch.randn(d, device="cuda", generator=g)) + torch.randn(
            d, device="cuda", generator=g
        )
    elif data == "spread":
        for x in (q, k, v):
            x.mul_(torch.exp2(20 * torch.rand(*x.shape[:-1], 1, device="cuda", generator=g) - 10))
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _mask(kind: str, shape, g):
    b, hq, _hk, lq, lk, _d = shape
    if kind == "keys":
        m = torch.ones(b, 1, 1, lk, dtype=torch.bool, device="cuda")
        m[..., lk - lk // 5 :] = False  # HunyuanVideo-style key padding
        return m.expand(b, hq, lq, lk)
    if kind == "additive":
        return torch.randn(b, hq, lq, lk, device="cuda", generator=g)
    return None


def fast_kernel_only(q, k, v, scale, *, mask=None, is_causal=False, debug_p=None, **kernel_options):
    """The fast mode's call (one chunk) with kernel options (qk_acc, pv_acc, block_m, num_warps,
    num_stages): pre-pass, fold, kernel; returns (out fp32, lse)."""
    from mxattention.kernels.attention_fwd_fp8 import fp8_operands, mx_attention_fwd_fp8
    from mxattention.kernels.prepass import prepass_qk, prepass_v
    from mxattention.kernels.rules import rule_constants

    b, hq, lq, _ = q.shape
    hk, lk, dv = k.shape[1], k.shape[2], v.shape[3]
    bm = kernel_options.pop("block_m", 128)
    kernel_options.setdefault("p_cvt", _hw_cast())  # as the plan (run_chunk_fp8)
    qb = prepass_qk(q, "uos", hadamard=True, len_multiple=max(bm, 128), out_bf16=True)
    kb = prepass_qk(k, "uos", hadamard=True, len_multiple=128, out_bf16=True)
    vb = prepass_v(v, "uos", len_multiple=128, out_bf16=True)
    ops = fp8_operands(qb, kb, vb, scale, hq // hk)
    pr = rule_constants(FAST.p.rule, FAST.p.elem)
    out = torch.empty(b, hq, lq, dv, device=q.device, dtype=torch.float32)
    lse = mx_attention_fwd_fp8(
        *ops, lq=lq, lk=lk, dv=dv, group=hq // hk, out=out, p_rule=(pr.ceil, pr.q_exp, pr.q_mant),
        pnq=True, block_n=FAST.block_n, is_causal=is_causal, mask=mask, block_m=bm, debug_p=debug_p,
        **kernel_options,
    )  # fmt: skip
    return out, lse


def _hw_cast() -> bool:
    """Whether the plan rounds P~ onto E4M3 by the hardware conversion on this GPU."""
    from mxattention.kernels.targets import current_target, hw_e4m3_cast

    return hw_e4m3_cast(current_target(torch.device("cuda")))


def _recorded_emulation(qf, kr, vr, mask, is_causal, scale):
    """reference_attention of mxattention-fast, with the folded P~ tiles it consumed (concatenated)."""
    import mxattention.attention.reference as ref_module

    tiles = []
    original = ref_module.quantize_p

    def recording(p_tilde, cfg):
        p = original(p_tilde, cfg)
        tiles.append(p)
        return p

    ref_module.quantize_p = recording
    try:
        o, lse = reference_attention(qf, kr, vr, FAST, mask=mask, is_causal=is_causal, scale=scale)
    finally:
        ref_module.quantize_p = original
    return o, lse, torch.cat(tiles, dim=-1)


def check_case(label, shape, dtype, causal, mask_kind, data) -> dict:
    from mxattention.attention.fast import fold_report
    from mxattention.kernels.fused import fused_attention

    _b, hq, hk, lq, lk, d = shape
    q, k, v = inputs(shape, dtype, data)
    g = torch.Generator(device="cuda").manual_seed(1)
    mask = _mask(mask_kind, shape, g)
    scale = d**-0.5
    group = hq // hk
    qf, kr, vr = q.float(), k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    row: dict = {
        "label": label,
        "shape": list(shape),
        "dtype": str(dtype),
        "causal": causal,
        "mask": mask_kind,
    }
    row["data"] = data
    small = hq * lq * lk <= 2**26
    fast = fused_attention(q, k, v, FAST, mask=mask, is_causal=causal, scale=scale, debug_p=small)
    exact_k = fused_attention(q, k, v, EXACT, mask=mask, is_causal=causal, scale=scale)
    if small:
        emu, emu_lse, p_emu = _recorded_emulation(qf, kr, vr, mask, causal, scale)
    else:
        emu, emu_lse = reference_attention(qf, kr, vr, FAST, mask=mask, is_causal=causal, scale=scale)
    exact_r, _ = reference_attention(qf, kr, vr, EXACT, mask=mask, is_causal=causal, scale=scale)
    fp, _ = reference_attention(qf, kr, vr, FP, mask=mask, is_causal=causal, scale=scale)
    emu_c, exact_rc = cast_output(emu, dtype).float(), cast_output(exact_r, dtype).float()
    out = fast.out.float()
    precise, _ = fast_kernel_only(q, k, v, scale, mask=mask, is_causal=causal, qk_acc=32, pv_acc=32)
    precise = cast_output(precise, dtype).float()
    own = _rel(exact_rc, fp)
    row.update(
        kernel_vs_emulation=_rel(out, emu_c),
        kernel_promoted_acc_vs_emulation=_rel(precise, emu_c),
        emulation_vs_exact_reference=_rel(emu_c, exact_rc),
        kernel_vs_exact_kernel=_rel(out, exact_k.out.float()),
        exact_kernel_vs_exact_reference=_rel(exact_k.out.float(), exact_rc),
        exact_vs_fp32=own,
        fast_vs_fp32=_rel(out, fp),
        deviation_of_own_error=_rel(out, exact_k.out.float()) / max(own, 1e-300),
        lse_max_abs_vs_emulation=_finite_max_abs(fast.lse, emu_lse),
        nonfinite_where_emulation_finite=int((~torch.isfinite(out) & torch.isfinite(emu_c)).sum()),
    )
    if small:
        n = p_emu.shape[-1]
        pk = fast.p_hat[..., :n]
        if causal:
            p_emu = torch.nn.functional.pad(p_emu, (0, pk.shape[-1] - n))
        pk, pe = pk[..., :lk], p_emu[..., :lk]
        row.update(p_decisions=pe.numel(), p_differ=int((pk != pe).sum()))
    ops = prepare_operands(qf, kr, vr, EXACT)
    row["outside_fold"] = fold_report(ops.q, ops.k, ops.v)
    row["ok"] = (
        row["deviation_of_own_error"] <= DEVIATION_OF_OWN_ERROR
        and not row["nonfinite_where_emulation_finite"]
    )
    return row


def _finite_max_abs(a, b) -> float:
    both = torch.isfinite(a) & torch.isfinite(b)
    return (a - b)[both].abs().max().item() if both.any() else 0.0


def row_sums() -> dict:
    """Induced weights (V = identity, so O's rows are the weights) of the kernel on outlier-heavy Q, K:
    max |row sum - 1| and the smallest weight."""
    lk = 200
    q, k, _ = inputs((1, 4, 4, 1000, lk, 128), torch.float32, "spread", seed=3)
    v = torch.eye(lk, device="cuda").expand(1, 4, lk, lk).contiguous()
    from mxattention.kernels.fused import fused_attention

    w = fused_attention(q * 3, k * 3, v, FAST, scale=128**-0.5).out
    dev = (w.sum(-1) - 1).abs().max().item()
    return {"max_abs_row_sum_minus_1": dev, "min_weight": w.min().item(), "ok": dev <= 1e-3}


def build_info() -> dict:
    from mxattention.kernels.attention_fwd_fp8 import build_fp8
    from mxattention.kernels.targets import current_target

    target = current_target(torch.device("cuda"))
    compiled, log = build_fp8(target)
    ptx = compiled.asm["ptx"]
    regs = re.findall(r"Used (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores", log)
    return {
        "target": target.name,
        "wgmma": dict(Counter(re.findall(r"wgmma\.mma_async\S*", ptx))),
        "registers": int(regs[-1]) if regs else None,
        "spill_store_bytes": int(spills[-1]) if spills else None,
        "shared_bytes": compiled.metadata.shared,
    }


def _bench(fn, rep_ms: float) -> float:
    import triton.testing

    fn()
    torch.cuda.synchronize()
    return float(triton.testing.do_bench(fn, warmup=max(1, rep_ms // 5), rep=rep_ms, return_mode="median"))


def speed(rep_ms: float, warmup_s: float, log) -> dict:
    """Each of SPEED_SHAPES timed by `speed_shape`, the GPU's memory freed in between."""
    results = {}
    for name, shape in SPEED_SHAPES.items():
        results[name] = speed_shape(name, shape, rep_ms, warmup_s, log)
        torch.cuda.empty_cache()
    return results


def speed_shape(name: str, shape, rep_ms: float, warmup_s: float, log) -> dict:
    """Median ms, TFLOP/s and speed against cuDNN of each candidate at shape (H, Lq, Lk, D), bf16."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from mxattention.kernels.attention_fwd_fp8 import fp8_operands, mx_attention_fwd_fp8
    from mxattention.kernels.fused import fused_attention
    from mxattention.kernels.prepass import prepass_qk, prepass_v
    from mxattention.kernels.rules import rule_constants

    h, lq, lk, d = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    chan = torch.exp(torch.randn(d, device="cuda", generator=g))
    q = (torch.randn(1, h, lq, d, device="cuda", generator=g) * chan).bfloat16()
    k = (torch.randn(1, h, lk, d, device="cuda", generator=g) * chan).bfloat16()
    v = torch.randn(1, h, lk, d, device="cuda", generator=g).bfloat16()
    scale = d**-0.5
    if warmup_s > 0:
        t_end = time.time() + warmup_s
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            while time.time() < t_end:
                torch.nn.functional.scaled_dot_product_attention(q, k, v)
                torch.cuda.synchronize()

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    def prep():
        qb = prepass_qk(q, "uos", hadamard=True, out_bf16=True)
        kb = prepass_qk(k, "uos", hadamard=True, out_bf16=True)
        vb = prepass_v(v, "uos", out_bf16=True)
        return fp8_operands(qb, kb, vb, scale, 1)

    ops = prep()
    pr = rule_constants(FAST.p.rule, FAST.p.elem)
    out = torch.empty(1, h, lq, d, device="cuda", dtype=torch.bfloat16)

    def kernel(**opt):
        assert ops[0].shape[2] % opt.get("block_m", 128) == 0
        opt.setdefault("p_cvt", _hw_cast())
        return lambda: mx_attention_fwd_fp8(
            *ops, lq=lq, lk=lk, dv=d, group=1, out=out, p_rule=(pr.ceil, pr.q_exp, pr.q_mant), pnq=True,
            block_n=FAST.block_n, **opt,
        )  # fmt: skip

    cands = {
        "sdpa_cudnn": cudnn,
        "mx_exact": lambda: fused_attention(q, k, v, EXACT, scale=scale),
        "mx_fast": lambda: fused_attention(q, k, v, FAST, scale=scale),
        "fast_prepass_and_fold": prep,
        "fast_kernel_w8_s2": kernel(num_warps=8, num_stages=2),
        "fast_kernel_w8_s3": kernel(num_warps=8, num_stages=3),
        "fast_kernel_w4_s2_bm64": kernel(num_warps=4, num_stages=2, block_m=64),
        "fast_kernel_promoted_qk": kernel(num_warps=8, num_stages=2, qk_acc=32),
        "fast_kernel_promoted_both": kernel(num_warps=8, num_stages=2, qk_acc=32, pv_acc=32),
        "fast_kernel_sw_p_round": kernel(num_warps=8, num_stages=2, p_cvt=False),
    }
    flop = 4.0 * lq * lk * d * h
    rows = {}
    for cname, fn in cands.items():
        try:
            ms = _bench(fn, rep_ms)
            rows[cname] = {"ms": ms, "tflops": flop / ms / 1e9}
        except Exception as e:  # a variant that does not build or fit: recorded, the rest go on
            rows[cname] = {"error": f"{type(e).__name__}: {e}"[:500]}
        log(f"{name} {cname}: {rows[cname]}")
    base = rows["sdpa_cudnn"].get("ms")
    for r in rows.values():
        if "ms" in r and base:
            r["vs_cudnn"] = base / r["ms"]  # > 1: faster than cuDNN
    return {"shape": [1, h, lq, lk, d], "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for check_fp8_gpu.json")
    ap.add_argument("--quick", action="store_true", help="the four small correctness cases only")
    ap.add_argument("--rep-ms", type=float, default=200.0, help="do_bench time per candidate (ms)")
    ap.add_argument("--warmup-s", type=float, default=5.0, help="cuDNN warm-up per speed shape (s)")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-correctness", action="store_true")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("check_fp8_gpu: needs a CUDA GPU", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_attention import run_meta

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "check_fp8_gpu.json"
    report: dict = {"meta": run_meta()}
    errors = 0

    def log(msg):
        print(msg, flush=True)

    def save():
        path.write_text(json.dumps(report, indent=1, default=str))

    def section(name, fn):
        nonlocal errors
        t = time.time()
        try:
            report[name] = fn()
        except Exception:
            errors += 1
            report[name] = {"error": traceback.format_exc()[-3000:]}
        log(f"[{name}] {time.time() - t:.1f} s: {json.dumps(report[name], default=str)[:1500]}")
        save()

    section("build", build_info)
    if not args.skip_correctness:
        cases = [c for c in CASES if not args.quick or c[0] in QUICK]

        def correctness():
            rows = []
            for c in cases:
                try:
                    rows.append(check_case(*c))
                except Exception:
                    rows.append({"label": c[0], "error": traceback.format_exc()[-3000:]})
                log(json.dumps(rows[-1], default=str)[:1500])
                torch.cuda.empty_cache()
            return rows

        section("correctness", correctness)
        section("row_sums", row_sums)
    if not args.skip_speed:
        section("speed", lambda: speed(args.rep_ms, args.warmup_s, log))
    save()
    bad = [
        r["label"] for r in report.get("correctness", []) if isinstance(r, dict) and not r.get("ok", False)
    ]
    if isinstance(report.get("row_sums"), dict) and not report["row_sums"].get("ok", True):
        bad.append("row_sums")
    for name, s in (report.get("speed") or {}).items():
        if isinstance(s, dict) and "rows" in s:
            r = s["rows"]
            log(
                f"speed {name}: fast {r.get('mx_fast', {}).get('vs_cudnn', float('nan')):.3f}x cuDNN, "
                f"exact {r.get('mx_exact', {}).get('vs_cudnn', float('nan')):.3f}x, fast kernel alone "
                f"{r.get('fast_kernel_w8_s2', {}).get('vs_cudnn', float('nan')):.3f}x"
            )
    log(f"wrote {path}; failing checks: {bad or 'none'}; sections raised: {errors}")
    if errors:
        return 2
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
