"""The fast mode's Gluon forward on sm_90 (`kernels.attention_fwd_hopper_fp8`), docs/fast_mode.md.

On the CPU: which calls the planner gives it (the Gluon FP8 kernel cannot run on Triton's
interpreter). On an sm_90 GPU: the kernel against the `tl` FP8 kernel (the same scores, P~ bytes and
FP8 k-steps), against its emulation within the fast mode's bound, P~'s hardware E4M3 rounding against
the software one (the same bits), and the induced weights' row sums (V = identity). Its build (wgmma kinds, spills, registers) is read offline by
`benchmarks/fp8_gluon_build.py` (a build costs ~6 s of CPU, over this suite's budget).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mxattention.attention.config import get_method
from mxattention.attention.reference import cast_output, reference_attention
from mxattention.kernels import attention_fwd_hopper_fp8 as fast_hopper
from mxattention.kernels import plan, targets
from mxattention.kernels.fused import fused_attention
from mxattention.kernels.specs import FwdKernel

from .helpers import qkv

FAST = get_method("mxattention-fast")
pytestmark = pytest.mark.skipif(not fast_hopper.HAS_GLUON, reason="this Triton has no Gluon Hopper layer")


def _on(monkeypatch, target):
    monkeypatch.setattr(plan, "current_target", lambda device: target)


def test_planner_gives_the_gluon_fp8_kernel_the_dense_head_dim_128_calls_on_sm_90(monkeypatch):
    q, k, v = qkv(1, 4, 2, 130, 200, 128)  # GQA, lengths not tile multiples
    _on(monkeypatch, targets.SM_90A)
    p = plan.plan_call(FAST, q, k, v, scale=0.1)
    assert p.fwd_kernel == "gluon" and p.mma == "fp8" and p.fwd.kernel is FwdKernel.GLUON
    assert p.fwd.constants["P_CVT"] is True and p.fwd.constants["OVERLAP"] is fast_hopper.OVERLAP
    assert "attention_fwd_hopper_fp8" in p.describe()
    # The exact method at the same call keeps its own Gluon forward.
    exact = plan.plan_call(get_method("mxattention"), q, k, v, scale=0.1)
    assert exact.fwd_kernel == "gluon" and "OVERLAP" not in exact.fwd.constants
    # What the Gluon FP8 kernel does not serve keeps the `tl` FP8 kernel.
    mask = torch.ones(1, 4, 130, 200, dtype=torch.bool)
    for kw in (dict(is_causal=True), dict(mask=mask), dict(debug_p=True)):
        other = plan.plan_call(FAST, q, k, v, scale=0.1, **kw)
        assert other.fwd_kernel == "tl" and other.mma == "fp8" and other.fwd.kernel is FwdKernel.TL, kw
    q64, k64, v64 = qkv(1, 2, 2, 130, 200, 64)
    assert plan.plan_call(FAST, q64, k64, v64, scale=0.1).fwd_kernel == "tl"
    no_pnq = dataclasses.replace(FAST, pnq=False, name="fast-no-pnq")  # its l is PNQ's (the MMA's)
    assert plan.plan_call(no_pnq, q, k, v, scale=0.1).fwd_kernel == "tl"
    # The override times both; an explicit "gluon" it cannot serve raises, naming why.
    assert plan.plan_call(FAST, q, k, v, scale=0.1, fwd_kernel="tl").fwd_kernel == "tl"
    with pytest.raises(ValueError, match="is_causal"):
        plan.plan_call(FAST, q, k, v, scale=0.1, is_causal=True, fwd_kernel="gluon")
    # Its P~ cast is its own switch (the `tl` kernel's stays off), and only where the target has it.
    monkeypatch.setattr(fast_hopper, "HW_P_CAST", False)
    assert plan.plan_call(FAST, q, k, v, scale=0.1).fwd.constants["P_CVT"] is False
    monkeypatch.setattr(fast_hopper, "HW_P_CAST", True)
    monkeypatch.setattr(targets, "HW_E4M3_CAST", frozenset())
    assert plan.plan_call(FAST, q, k, v, scale=0.1).fwd.constants["P_CVT"] is False


def test_schedule_variants_override_only_their_constexprs_of_the_kernel(monkeypatch):
    """Each of `VARIANTS` (what benchmarks/fp8_variants.py times) names parameters of the kernel and
    changes only those of the planned spec; an unknown name is refused."""
    q, k, v = qkv(1, 2, 2, 130, 200, 128)
    _on(monkeypatch, targets.SM_90A)
    spec = plan.plan_call(FAST, q, k, v, scale=0.1).fwd
    params = set(fast_hopper._fast_fwd_hopper_kernel.arg_names)
    for name, over in fast_hopper.VARIANTS.items():
        assert set(over) <= params, name
        got = fast_hopper.variant_spec(spec, name)
        assert got.kernel is spec.kernel and got.num_warps == spec.num_warps
        assert got.constants == {**spec.constants, **over}, name
    assert fast_hopper.variant_spec(spec, "default") == spec
    with pytest.raises(ValueError, match="variant must be one of"):
        fast_hopper.variant_spec(spec, "overlap2")


def test_planner_keeps_the_tl_fp8_kernel_off_sm_90(monkeypatch):
    q, k, v = qkv(1, 2, 2, 130, 200, 128)
    assert plan.plan_call(FAST, q, k, v, scale=0.1, target=None).fwd_kernel == "tl"  # the interpreter
    _on(monkeypatch, targets.SM_100A)
    assert plan.plan_call(FAST, q, k, v, scale=0.1).fwd_kernel == "tl"


# ---- On an sm_90 GPU ----------------------------------------------------------------------------------


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


gpu = pytest.mark.skipif(not _sm90(), reason="the Gluon FP8 forward runs on sm_90 GPUs")


def _inputs(kind: str, shape, seed: int, dtype=torch.bfloat16):
    b, hq, hk, lq, lk = shape
    q, k, v = qkv(b, hq, hk, lq, lk, 128, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    if kind == "spread":  # per-token magnitudes over 2**[-10, 10]: blocks outside the exact fold
        for x in (q, k, v):
            x.mul_(torch.exp2(20 * torch.rand(*x.shape[:-1], 1, generator=g) - 10))
    elif kind == "zeros":  # a zero K head and zero Q rows (anchors of all-zero groups)
        k[:, 0] = 0.0
        q[:, :, ::7] = 0.0
    return q.to(dtype).cuda(), k.to(dtype).cuda(), v.to(dtype).cuda()


CASES = [
    ("outliers", (1, 4, 4, 1000, 1333)),
    ("gqa", (2, 8, 2, 700, 900)),
    ("spread", (1, 4, 4, 513, 777)),
    ("zeros", (1, 2, 2, 300, 257)),
    ("one-tile", (1, 2, 2, 64, 100)),
]


@gpu
@pytest.mark.parametrize("kind,shape", CASES, ids=[c[0] for c in CASES])
def test_gluon_fp8_kernel_matches_the_tl_fp8_kernel(kind, shape):
    """The same scores, P~ bytes and FP8 instruction groups (32 keys per k-step) as the `tl` kernel;
    within a k-step the P~ V^ products come in `key_slot` order, not in key order, and with the
    hardware P~ cast l sums the values before the conversion's rounding (they differ below 2**-16 of
    a row's largest), so O and l may differ slightly (check_fp8_gpu.py reports whether the bits are
    equal). lse: within 1e-3 or 2**-20 of itself (scores of ~1e6 in the `spread` case)."""
    q, k, v = _inputs(kind, shape, seed=len(kind))
    scale = 128**-0.5
    got = fused_attention(q, k, v, FAST, scale=scale, fwd_kernel="gluon")
    want = fused_attention(q, k, v, FAST, scale=scale, fwd_kernel="tl")
    assert torch.equal(torch.isfinite(got.out), torch.isfinite(want.out))
    fin = torch.isfinite(want.out)
    a, b = got.out.float()[fin].double(), want.out.float()[fin].double()
    # (Hopper's FP8 accumulator keeps ~14 bits per k-step: a permuted order there moves O by far less
    # than 1e-3; a wrong key order or layout moves it by O(1).)
    assert ((a - b).norm() / b.norm()).item() <= 1e-3
    assert torch.allclose(got.lse, want.lse, rtol=2**-20, atol=1e-3, equal_nan=True)


@gpu
@pytest.mark.parametrize("kind,shape", CASES, ids=[c[0] for c in CASES])
def test_gluon_fp8_kernel_within_the_fast_modes_bound_of_its_emulation(kind, shape):
    """rel-L2 to the emulation at most 2 % of the method's own error against fp32 attention (issue
    29's bound for the fast mode's deviation, docs/fast_mode.md), finite where the emulation is."""
    q, k, v = _inputs(kind, shape, seed=len(kind))
    scale = 128**-0.5
    out = fused_attention(q, k, v, FAST, scale=scale, fwd_kernel="gluon").out.float()
    group = q.shape[1] // k.shape[1]
    qf, kr, vr = q.float(), k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    emu, _ = reference_attention(qf, kr, vr, FAST, scale=scale)
    emu = cast_output(emu, q.dtype).float()
    fp, _ = reference_attention(qf, kr, vr, get_method("fp"), scale=scale)
    assert torch.equal(torch.isfinite(out), torch.isfinite(emu))
    dev = ((out - emu).double().norm() / emu.double().norm()).item()
    own = ((emu - fp).double().norm() / fp.double().norm()).item()
    assert dev <= 0.02 * own, (dev, own)


@gpu
def test_gluon_fp8_hardware_p_cast_matches_the_software_rounding(monkeypatch):
    """The hardware conversion writes the software rounding's P~ bytes, and l sums r3 either way (an
    E4M3 value under `fp8_p_tile`'s block-scale floor), in the same order: O and lse bit for bit.
    Before that floor l summed the values before the conversion's rounding, and the lse of the
    `spread` rows moved by more than 1e-3 (H200, 2026-12-04)."""
    q, k, v = _inputs("spread", (1, 4, 2, 600, 1000), seed=5)
    outs = []
    for hw in (True, False):
        monkeypatch.setattr(fast_hopper, "HW_P_CAST", hw)
        p = plan.plan_call(FAST, q, k, v, scale=0.1)
        assert p.fwd_kernel == "gluon" and p.fwd.constants["P_CVT"] is hw
        outs.append(fused_attention(q, k, v, FAST, scale=0.1, plan=p))
    assert torch.equal(outs[0].out, outs[1].out)
    assert torch.equal(outs[0].lse, outs[1].lse)


@gpu
def test_gluon_fp8_induced_weights_sum_to_one():
    """V = identity (128 keys, one tile): O's rows are the weights applied to V; outlier-heavy fp32
    Q, K with zero rows (the case that gave NaN rows to the `tl` kernel's hardware cast)."""
    q, k, _ = _inputs("spread", (1, 4, 4, 1000, 128), seed=3)
    q, k = q.float() * 3, k.float() * 3
    q[:, :, 5] = 0.0
    v = torch.eye(128, device="cuda").expand(1, 4, 128, 128).contiguous()
    w = fused_attention(q, k, v, FAST, scale=128**-0.5, fwd_kernel="gluon").out
    assert torch.isfinite(w).all()
    assert (w.sum(-1) - 1).abs().max().item() <= 1e-3


@gpu
def test_gluon_fp8_software_p_cast_is_in_the_build_only_without_p_cvt():
    """P_CVT=False rounds P~ onto E4M3 in software (`cast.e4m3_round`: its constants 2**20 and 448 in
    the PTX), P_CVT=True leaves it to the conversion (built offline for sm_90a, a few seconds of
    CPU: here with the GPU tests, not in the CPU suite)."""
    from mxattention.kernels.codegen import compile_offline

    q, k, v = qkv(1, 2, 2, 256, 256, 128)
    spec = plan.plan_call(FAST, q, k, v, scale=0.1, target=targets.SM_90A).fwd
    f8 = torch.float8_e4m3fn
    ops = (torch.empty(1, 2, 256, 128, dtype=f8), torch.empty(1, 2, 256), torch.empty(1, 2, 256, 128, dtype=f8),
           torch.empty(1, 2, 128, 256, dtype=f8), torch.empty(1, 2, 128))  # fmt: skip
    out = torch.empty(1, 2, 256, 128, dtype=torch.bfloat16)
    for p_cvt in (False, True):
        sp = dataclasses.replace(spec, constexprs=tuple(dict(spec.constexprs, P_CVT=p_cvt).items()))
        _, call = fast_hopper.fast_gluon_launch(sp, *ops, lq=256, lk=256, group=1, out=out)
        kw = dict(sp.constants, num_warps=sp.num_warps)
        compiled, _ = compile_offline(fast_hopper._fast_fwd_hopper_kernel, call.args, kw, targets.SM_90A)
        ptx = compiled.asm["ptx"]
        assert ("0f49800000" in ptx and "0f43E00000" in ptx) is not p_cvt, p_cvt


@gpu
def test_gluon_fp8_weights_sum_to_one_over_many_tiny_keys():
    """One key 14 above 4096 others in score (exactly, after the rotation and the MX casts: Q^ and
    K^ are +-2**i in every column): the others' P~ is e**-14 ~ 2**-20.2 of the row's largest, which
    the block-scale floor (2**-16 of the row's largest, `formats.fold.P_MIN_EXP`) rounds to 0 in the
    bytes and in l alike, so O = the weights' row sum (V = 1) is 1 (the reference's value). Without
    the floor l held the 4096 values (E2M1 at their own scale) that E4M3 drops, and the sum fell
    short of 1 by ~3e-3, over issue 29's 1e-3."""
    d, n = 128, 4097
    q = torch.zeros(1, 1, 64, d, device="cuda")
    q[..., 0] = d**0.5  # rotated: +-1 in every column
    k = torch.zeros(1, 1, n, d, device="cuda")
    k[:, :, 0, 0] = 16 * d**0.5  # score 16 (scale 1/128, 128 columns of +-1 x +-16)
    k[:, :, 1:, 0] = 2 * d**0.5  # score 2
    v = torch.ones(1, 1, n, d, device="cuda")
    p = plan.plan_call(FAST, q, k, v, scale=1.0 / d)
    assert p.fwd_kernel == "gluon"
    out = fused_attention(q, k, v, FAST, scale=1.0 / d, plan=p).out.double()
    want, _ = reference_attention(q, k, v, FAST, scale=1.0 / d)
    assert torch.equal(want, torch.ones_like(want))
    assert (out - 1).abs().max().item() <= 1e-6


@gpu
@pytest.mark.parametrize("variant", [n for n in fast_hopper.VARIANTS if n != "default"])
def test_gluon_fp8_schedule_variants_agree_with_the_planned_kernel(variant):
    """Every schedule variant consumes the planned kernel's P~ bytes: O within 1e-3 (rel-L2; only
    the fp32 order of l's and O~'s sums differ), lse as the `tl` kernel's, rows of the induced
    weights summing to 1 within 1e-3 (V = identity tiled over 1000 keys: 8 tiles, so the ring's
    slots and phases wrap; fp32 Q, K with a zero row)."""
    q, k, _ = _inputs("spread", (1, 4, 4, 600, 1000), seed=7)
    q, k = q.float() * 3, k.float() * 3
    q[:, :, 5] = 0.0
    v = torch.eye(128, device="cuda").repeat(8, 1)[:1000].expand(1, 4, 1000, 128).contiguous()
    p = plan.plan_call(FAST, q, k, v, scale=128**-0.5)
    alt = dataclasses.replace(p, fwd=fast_hopper.variant_spec(p.fwd, variant))
    got, want = (fused_attention(q, k, v, FAST, scale=128**-0.5, plan=x) for x in (alt, p))
    a, b = got.out.double(), want.out.double()
    assert torch.isfinite(a).all()
    assert ((a - b).norm() / b.norm()).item() <= 1e-3
    assert torch.allclose(got.lse, want.lse, rtol=2**-20, atol=1e-3)
    assert (a.sum(-1) - 1).abs().max().item() <= 1e-3
