"""GPU check of the fast mode (`mxattention-fast`, FP8 tensor cores; issue 29, docs/fast_mode.md).

Run from the repository root on a CUDA GPU with FP8 MMAs (sm_89+; built for the H200, ~5 minutes):

    PYTHONPATH=src:. python benchmarks/check_fp8_gpu.py --out DIR [--quick] [--rep-ms 100] [--warmup-s 3]

Two FP8 kernels: the `tl` one (`attention_fwd_fp8`, every call) and, on sm_90, the warp-specialized
Gluon one (`attention_fwd_hopper_fp8`, dense unmasked head-dim-128 calls without debug_p, the plan's
default there). Sections (each records its error instead of stopping the run; a kernel that does not
build is reported and the rest go on):

0. gpu_tests: pytest of tests/kernels/test_attention_fwd_fp8_gluon.py and test_attention_fwd_fp8.py.
1. build: the FP8 wgmma kinds in the PTX of each kernel this GPU compiles, registers, spills (the Gluon
   one per key tile too, `fp8_gluon_build.summarize_fast_gluon`).
2. correctness at several shapes (lengths that are not tile multiples, GQA, causal, masks, bf16,
   DiT-like and outlier-heavy inputs): the `tl` kernel against its emulation (`reference_attention` of
   mxattention-fast, on the GPU), against the exact method (kernel and reference), and every one
   against fp32 attention; differing folded-P~ decisions, lse, rows / blocks outside the exact fold;
   the kernel again with every FP8 k-step promoted to fp32 (`qk_acc = pv_acc = 32`), which isolates
   what Hopper's FP8 accumulator adds; where the Gluon kernel serves the case, the same against the
   emulation (`gluon_*`) and its bits against the `tl` kernel's. The induced weights' row sums (V =
   identity), for each kernel.
3. speed in one process, after a cuDNN warm-up, at (1, 40, 16384, 16384, 128), (1, 24, 32760, 32760,
   128) and (1, 40, 32760, 512, 128) bf16: cuDNN SDPA, the exact mxattention (whole call), the fast
   mode's whole call (the public entry, and `fused_attention` with each kernel), each kernel alone on
   prepared operands (the `tl` one in two tilings, the Gluon one as planned, with the software P~
   rounding, with either overlap, with l summed per tile, with 3 ring stages), the bf16 pre-pass + fold alone and the
   planned operands straight from Q, K, V (`fp8_operands_from_inputs`; their bytes checked equal first).

Writes DIR/check_fp8_gpu.json and prints a table. Exits 1 if a hard check fails (a fast kernel's
deviation from the exact method over 2 % of the method's own error, non-finite outputs where the
emulation is finite, row sums off by more than 1e-3), 2 if a section raised.
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
    ("gqa-d128-bf16", (2, 8, 2, 700, 900, 128), torch.bfloat16, False, "", "outliers"),
]
QUICK = {"ragged-fp32", "gqa-d64-causal-bf16", "key-mask-bf16", "outlier-heavy-2k", "gqa-d128-bf16"}
SPEED_SHAPES = {
    "16k": (40, 16384, 16384, 128),
    "hunyuan-32k": (24, 32760, 32760, 128),
    "cross-32k-512": (40, 32760, 512, 128),
}


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
    from mxattention.kernels.attention_fwd_fp8 import fp8_operands_via_bf16, mx_attention_fwd_fp8
    from mxattention.kernels.rules import rule_constants

    b, hq, lq, _ = q.shape
    hk, lk, dv = k.shape[1], k.shape[2], v.shape[3]
    bm = kernel_options.pop("block_m", 128)
    kernel_options.setdefault("p_cvt", _hw_cast())  # as the plan (fused._run_chunk_fp8)
    ops = fp8_operands_via_bf16(
        q, k, v, ("uos",) * 3, hadamard=True, scale=scale, q_len_multiple=max(bm, 128), k_len_multiple=128,
        slots=False,  # the tl kernel's V^ order
    )  # fmt: skip
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
    fast = fused_attention(
        q, k, v, FAST, mask=mask, is_causal=causal, scale=scale, debug_p=small, fwd_kernel="tl"
    )
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
    row["max_abs_vs_emulation"] = _finite_max_abs(out, emu_c)
    row["ok"] = (
        row["deviation_of_own_error"] <= DEVIATION_OF_OWN_ERROR
        and not row["nonfinite_where_emulation_finite"]
    )
    row["gluon"] = "not served"
    if _gluon_serves(q, k, v, mask, causal, scale):
        try:
            g = fused_attention(q, k, v, FAST, mask=mask, is_causal=causal, scale=scale, fwd_kernel="gluon")
            go = g.out.float()
            row["gluon"] = dict(
                vs_emulation=_rel(go, emu_c),
                max_abs_vs_emulation=_finite_max_abs(go, emu_c),
                vs_exact_kernel=_rel(go, exact_k.out.float()),
                deviation_of_own_error=_rel(go, exact_k.out.float()) / max(own, 1e-300),
                lse_max_abs_vs_emulation=_finite_max_abs(g.lse, emu_lse),
                nonfinite_where_emulation_finite=int((~torch.isfinite(go) & torch.isfinite(emu_c)).sum()),
                bits_equal_tl_kernel=bool(torch.equal(g.out, fast.out) and torch.equal(g.lse, fast.lse)),
                max_abs_vs_tl_kernel=_finite_max_abs(go, out),
            )
            row["ok"] = row["ok"] and (
                row["gluon"]["deviation_of_own_error"] <= DEVIATION_OF_OWN_ERROR
                and not row["gluon"]["nonfinite_where_emulation_finite"]
            )
        except Exception as e:  # a kernel that does not build: reported, the rest go on
            row["gluon"] = {"error": f"{type(e).__name__}: {e}"[-2000:]}
            row["ok"] = False
    return row


def _gluon_serves(q, k, v, mask, causal, scale) -> bool:
    """Whether the plan gives this fast-mode call the Gluon FP8 kernel (sm_90, D 128, dense unmasked)."""
    from mxattention.kernels.plan import plan_call

    return plan_call(FAST, q, k, v, scale=scale, mask=mask, is_causal=causal).fwd_kernel == "gluon"


def _finite_max_abs(a, b) -> float:
    both = torch.isfinite(a) & torch.isfinite(b)
    return (a - b)[both].abs().max().item() if both.any() else 0.0


def row_sums() -> dict:
    """Induced weights (V = identity, so O's rows are the weights) of each kernel on outlier-heavy Q,
    K: max |row sum - 1|, the smallest weight, non-finite rows. 200 keys (Dv 200: the `tl` kernel)
    and 128 keys (Dv 128: the Gluon kernel where it serves, and the `tl` kernel)."""
    from mxattention.kernels.fused import fused_attention

    res = {}
    for lk, kernels in ((200, ("tl",)), (128, ("tl", "gluon"))):
        q, k, _ = inputs((1, 4, 4, 1000, lk, 128), torch.float32, "spread", seed=3)
        v = torch.eye(lk, device="cuda").expand(1, 4, lk, lk).contiguous()
        for kern in kernels:
            try:
                w = fused_attention(q * 3, k * 3, v, FAST, scale=128**-0.5, fwd_kernel=kern).out
            except Exception as e:  # not served here (no sm_90) or not built
                res[f"{kern}_lk{lk}"] = {"error": f"{type(e).__name__}: {e}"[-1000:]}
                continue
            dev = torch.nan_to_num((w.sum(-1) - 1).abs(), nan=float("inf")).max().item()
            res[f"{kern}_lk{lk}"] = {
                "max_abs_row_sum_minus_1": dev,
                "min_weight": w.min().item(),
                "nonfinite_rows": int((~torch.isfinite(w)).any(-1).sum()),
                "ok": dev <= 1e-3,
            }
    res["ok"] = all(r.get("ok", True) for r in res.values() if isinstance(r, dict) and "error" not in r)
    return res


def build_info() -> dict:
    from mxattention.kernels.codegen import build_fp8
    from mxattention.kernels.targets import current_target

    target = current_target(torch.device("cuda"))
    compiled, log = build_fp8(target)
    ptx = compiled.asm["ptx"]
    regs = re.findall(r"Used (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores", log)
    info = {
        "target": target.name,
        "wgmma": dict(Counter(re.findall(r"wgmma\.mma_async\S*", ptx))),
        "registers": int(regs[-1]) if regs else None,
        "spill_store_bytes": int(spills[-1]) if spills else None,
        "shared_bytes": compiled.metadata.shared,
    }
    if target.family == "sm_90":
        from fp8_gluon_build import summarize_fast_gluon

        for name, kw in (
            ("gluon", {}),
            ("gluon_sw_p", {"P_CVT": False}),
            ("gluon_overlap", {"OVERLAP": True}),
            ("gluon_qk_ahead", {"OVERLAP": 2}),
        ):
            try:
                info[name] = summarize_fast_gluon(target, **kw)
            except Exception as e:  # reported, the rest go on
                info[name] = {"error": f"{type(e).__name__}: {e}"[-2000:]}
    return info


def gpu_tests() -> dict:
    """pytest of the fast mode's kernel tests on this GPU (a subprocess, 240 s at most)."""
    import subprocess

    files = ["tests/kernels/test_attention_fwd_fp8_gluon.py", "tests/kernels/test_attention_fwd_fp8.py"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", *files]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as e:
        return {"error": f"timed out after 240 s: {str(e.stdout)[-2000:]}", "ok": False}
    tail = (r.stdout + r.stderr).strip().splitlines()
    return {"returncode": r.returncode, "summary": tail[-1] if tail else "", "output_tail": "\n".join(tail[-60:]),
            "ok": r.returncode == 0}  # fmt: skip


def _bench(fn, rep_ms: float) -> float:
    import triton.testing

    fn()
    torch.cuda.synchronize()
    return float(triton.testing.do_bench(fn, warmup=max(1, rep_ms // 5), rep=rep_ms, return_mode="median"))


# The run's end (time.time()): speed candidates past it are skipped, so one command stays within
# the 8 minutes a GPU session gives it (`main --budget-s`).
DEADLINE = [float("inf")]


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

    from mxattention.kernels.attention_fwd_fp8 import HW_P_CAST, fp8_operands_via_bf16, mx_attention_fwd_fp8
    from mxattention.kernels.fused import fused_attention
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

    def prep(slots: bool = True):  # the bf16 maker; V^ in the Gluon kernel's order by default
        return fp8_operands_via_bf16(
            q, k, v, ("uos",) * 3, hadamard=True, scale=scale, q_len_multiple=128, k_len_multiple=128,
            slots=slots,
        )  # fmt: skip

    from mxattention.kernels.attention_fwd_fp8 import fp8_operands_from_inputs
    from mxattention.kernels.plan import plan_call

    fast_plan = plan_call(FAST, q, k, v, scale=scale)
    fast_passes = (fast_plan.chunks[0].q_pass, fast_plan.chunks[0].k_pass, fast_plan.chunks[0].v_pass)

    def prep_planned():  # the planned path (run_chunk_fp8): the same bytes straight from Q, K, V
        return fp8_operands_from_inputs(
            q, k, v, fast_plan.rules, hadamard=True, scale=scale, q_len_multiple=128, k_len_multiple=128,
            slots=True, passes=fast_passes,
        )  # fmt: skip

    ops, ops_tl = prep(), prep(slots=False)
    planned = prep_planned()
    same = all(torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                           b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)
               for a, b in zip(ops, planned, strict=True))  # fmt: skip
    log(f"{name}: planned fast-mode operands equal the bf16 pre-pass + fp8_operands: {same}")
    del planned
    pr = rule_constants(FAST.p.rule, FAST.p.elem)
    p_rule = (pr.ceil, pr.q_exp, pr.q_mant)
    out = torch.empty(1, h, lq, d, device="cuda", dtype=torch.bfloat16)

    def kernel(**opt):
        assert ops_tl[0].shape[2] % opt.get("block_m", 128) == 0
        opt.setdefault("p_cvt", _hw_cast() and HW_P_CAST)  # the plan's choice
        return lambda: mx_attention_fwd_fp8(
            *ops_tl, lq=lq, lk=lk, dv=d, group=1, out=out, p_rule=p_rule, pnq=True, block_n=FAST.block_n, **opt,
        )  # fmt: skip

    def gluon_kernel(**constexprs):
        from mxattention.kernels import attention_fwd_hopper_fp8 as fast
        from mxattention.kernels.attention_fwd_hopper_fp8 import gluon_fp8_fwd_spec
        from mxattention.kernels.specs import FwdSpec

        spec = gluon_fp8_fwd_spec(p_rule=p_rule, pnq=True, out_dtype=torch.bfloat16,
                                  p_cvt=fast.HW_P_CAST and _hw_cast())  # fmt: skip
        spec = FwdSpec(spec.kernel, tuple(dict(spec.constexprs, **constexprs).items()), spec.num_warps)
        return lambda: fast.mx_attention_fwd_hopper_fp8(*ops, spec=spec, lq=lq, lk=lk, group=1, out=out)

    import mxattention

    cands = {
        "sdpa_cudnn": cudnn,
        "mx_exact": lambda: fused_attention(q, k, v, EXACT, scale=scale),
        "mx_exact_public": lambda: mxattention.scaled_dot_product_attention(q, k, v, method=EXACT),
        "mx_fast_public": lambda: mxattention.scaled_dot_product_attention(q, k, v, method=FAST),
        "fast_prepass_and_fold": prep,
        "fast_operands_planned": prep_planned,
        "fast_kernel_gluon": gluon_kernel(),
        "mx_fast_call_tl": lambda: fused_attention(q, k, v, FAST, scale=scale, fwd_kernel="tl"),
        "mx_fast_call_gluon": lambda: fused_attention(q, k, v, FAST, scale=scale, fwd_kernel="gluon"),
        "fast_kernel_tl_w8_s2": kernel(num_warps=8, num_stages=2),
        "fast_kernel_tl_w4_s2_bm64": kernel(num_warps=4, num_stages=2, block_m=64),
        "fast_kernel_gluon_sw_p": gluon_kernel(P_CVT=False),
        "fast_kernel_gluon_overlap": gluon_kernel(OVERLAP=True),
        "fast_kernel_gluon_qk_ahead": gluon_kernel(OVERLAP=2),
        "fast_kernel_gluon_l_per_tile": gluon_kernel(L_PARTIAL=False),
        "fast_kernel_gluon_3_stages": gluon_kernel(STAGES=3),
    }
    flop = 4.0 * lq * lk * d * h
    rows = {}
    for cname, fn in cands.items():
        if time.time() > DEADLINE[0]:
            rows[cname] = {"error": "skipped: the run's time budget (--budget-s) is spent"}
            continue
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
    return {"shape": [1, h, lq, lk, d], "rows": rows, "planned_operands_equal": same}


TABLE_ROWS = (
    "sdpa_cudnn", "mx_exact", "mx_exact_public", "mx_fast_public", "mx_fast_call_tl", "mx_fast_call_gluon",
    "fast_prepass_and_fold", "fast_kernel_tl_w8_s2", "fast_kernel_tl_w4_s2_bm64", "fast_kernel_gluon",
    "fast_kernel_gluon_sw_p", "fast_kernel_gluon_overlap", "fast_kernel_gluon_qk_ahead",
    "fast_kernel_gluon_l_per_tile", "fast_kernel_gluon_3_stages",
)  # fmt: skip


def table(report: dict) -> str:
    """The speed section as a text table (ms and x cuDNN per candidate and shape) and the checks' verdicts."""
    speed = {k: v for k, v in (report.get("speed") or {}).items() if isinstance(v, dict) and "rows" in v}
    lines = ["candidate".ljust(30) + "".join(f"{name:>24}" for name in speed)]
    for cand in TABLE_ROWS:
        cells = []
        for s in speed.values():
            r = s["rows"].get(cand, {})
            if "ms" in r:
                cells.append(f"{r['ms']:9.3f} ms {r.get('vs_cudnn', float('nan')):6.3f}x")
            else:
                cells.append("error" if "error" in r else "-")
        lines.append(cand.ljust(30) + "".join(f"{c:>24}" for c in cells))
    for row in report.get("correctness", []) if isinstance(report.get("correctness"), list) else []:
        g = row.get("gluon")
        gs = g if isinstance(g, str) else (
            f"gluon dev {g['deviation_of_own_error']:.2e} max|d| {g['max_abs_vs_emulation']:.2e} "
            f"bits=tl {g['bits_equal_tl_kernel']}" if isinstance(g, dict) and "error" not in g else "gluon ERROR"
        )  # fmt: skip
        tl = "ERROR" if "error" in row else f"tl dev {row['deviation_of_own_error']:.2e}"
        lines.append(f"case {row.get('label')}: ok={row.get('ok')} {tl}; {gs}")
    for name in ("gpu_tests", "row_sums"):
        r = report.get(name)
        if isinstance(r, dict):
            lines.append(f"{name}: ok={r.get('ok')} {r.get('summary', '')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for check_fp8_gpu.json")
    ap.add_argument("--quick", action="store_true", help="the five small correctness cases only")
    ap.add_argument("--rep-ms", type=float, default=100.0, help="do_bench time per candidate (ms)")
    ap.add_argument("--warmup-s", type=float, default=3.0, help="cuDNN warm-up per speed shape (s)")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--budget-s", type=float, default=450.0, help="skip speed candidates after this (s)")
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
    DEADLINE[0] = time.time() + args.budget_s
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

    if not args.skip_tests:
        section("gpu_tests", gpu_tests)
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
    for name in ("row_sums", "gpu_tests"):
        if isinstance(report.get(name), dict) and not report[name].get("ok", True):
            bad.append(name)
    log(table(report))
    log(f"wrote {path}; failing checks: {bad or 'none'}; sections raised: {errors}")
    if errors:
        return 2
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
