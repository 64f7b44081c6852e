"""The warp-specialized Gluon forward (`kernels.attention_fwd_hopper`): which calls it serves, its
argument checks (CPU), and, on an sm_90 GPU, bit-for-bit equality with the `tl` kernel
(`attention_fwd`) on the same pre-pass outputs: O and lse, every P~ ladder, rule and PNQ setting,
lengths off the tiles, GQA, outliers, ties, zeros, NaN / Inf, huge and tiny block scales."""

import pytest
import torch

from mxattention.kernels import attention_fwd_hopper as hopper
from mxattention.kernels import targets
from mxattention.kernels.rules import rule_constants
from mxattention.kernels.targets import SM_90A, SM_100A

SUPPORTED = dict(kv_bf16=True, dq=128, dv=128, block_n=128)


def _is_sm90() -> bool:
    if not torch.cuda.is_available():
        return False
    from mxattention.kernels._triton import kernels_interpreted

    return not kernels_interpreted() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.skipif(not hopper.HAS_GLUON, reason="this Triton has no Gluon")
def test_reason_serves_the_dense_bf16_d128_case():
    assert hopper.gluon_fwd_reason(**SUPPORTED) is None
    assert hopper.gluon_fwd_reason(**SUPPORTED, p_elem="e4m3", qk_elem="e4m3", scale=1e-30) is None


@pytest.mark.skipif(not hopper.HAS_GLUON, reason="this Triton has no Gluon")
@pytest.mark.parametrize(
    "change,word",
    [
        (dict(kv_bf16=False), "kv_layout"),
        (dict(dq=64, dv=64), "head dims"),
        (dict(dv=64), "head dims"),
        (dict(block_n=64), "block_n"),
        (dict(is_causal=True), "is_causal"),
        (dict(masked=True), "mask"),
        (dict(varlen=True), "varlen"),
        (dict(debug_p=True), "debug_p"),
        (dict(smooth_q_block=64), "smooth_q_block"),
        (dict(smooth_q_block=192), "smooth_q_block"),
        (dict(p_elem="e3m2"), "ladders"),
        (dict(scale=0.0), "scale"),
        (dict(scale=float("inf")), "scale"),
    ],
)
def test_reason_names_what_it_does_not_serve(change, word):
    reason = hopper.gluon_fwd_reason(**{**SUPPORTED, **change})
    assert reason is not None and word in reason


def test_kernel_choice_is_one_frozen_switch(monkeypatch):
    """Default "tl" until targets.GLUON_FWD lists the family; then "gluon" only for served calls on
    sm_90; an explicit request wins or, for "gluon" where it cannot run, raises."""
    assert isinstance(targets.GLUON_FWD, frozenset)
    monkeypatch.setattr(targets, "GLUON_FWD", frozenset())
    assert hopper.fwd_kernel_for(SM_90A, None) == "tl"
    monkeypatch.setattr(targets, "GLUON_FWD", frozenset({"sm_90"}))
    assert hopper.fwd_kernel_for(SM_90A, None) == "gluon"
    assert hopper.fwd_kernel_for(SM_90A, "causal") == "tl"
    assert hopper.fwd_kernel_for(SM_100A, None) == "tl"
    assert hopper.fwd_kernel_for(None, None) == "tl"
    assert hopper.fwd_kernel_for(SM_90A, None, "tl") == "tl"
    assert hopper.fwd_kernel_for(SM_90A, None, "gluon") == "gluon"
    with pytest.raises(ValueError, match="is_causal"):
        hopper.fwd_kernel_for(SM_90A, "is_causal: not served", "gluon")
    with pytest.raises(ValueError, match="sm_90"):
        hopper.fwd_kernel_for(SM_100A, None, "gluon")
    with pytest.raises(ValueError, match="fwd_kernel"):
        hopper.fwd_kernel_for(SM_90A, None, "triton")


def test_fused_attention_refuses_an_explicit_gluon_it_cannot_run():
    from mxattention.attention.config import get_method
    from mxattention.kernels.fused import fused_attention

    q = torch.zeros(1, 1, 8, 128)
    with pytest.raises(ValueError, match="fwd_kernel"):
        fused_attention(q, q, q, get_method("mxattention"), scale=0.1, fwd_kernel="triton")


@pytest.mark.skipif(not hopper.HAS_GLUON, reason="this Triton has no Gluon")
@pytest.mark.parametrize(
    "bad",
    ["q_rows", "k_dim", "v_shape", "k_dtype", "heads", "out_shape", "empty_keys"]
    + ["smooth_block", "smooth_shape", "smooth_dtype", "smooth_strides", None],
)
def test_launch_arguments_are_checked(bad):
    b, h, lq, lk = 1, 2, 100, 130
    qc = torch.zeros(b, h, 128, 64, dtype=torch.uint8)
    qs = torch.zeros(b, h, 128, 4, dtype=torch.uint8)
    kx = torch.zeros(b, h, 256, 128, dtype=torch.bfloat16)
    vx = kx.clone()
    out = torch.empty(b, h, lq, 128, dtype=torch.bfloat16)
    group = 1
    smooth = (torch.zeros(b, h, 1, 256), 128)  # [B, Hq, ceil(Lq / 128), LKP]
    if bad == "q_rows":
        qc, qs = qc[:, :, :100], qs[:, :, :100]
    elif bad == "k_dim":
        kx = kx[..., :64].contiguous()
    elif bad == "v_shape":
        vx = vx[:, :, :128].contiguous()
    elif bad == "k_dtype":
        kx = kx.half()
    elif bad == "heads":
        group = 2
    elif bad == "out_shape":
        out = out[..., :64]
    elif bad == "empty_keys":
        lk = 0
    elif bad == "smooth_block":
        smooth = (smooth[0], 64)
    elif bad == "smooth_shape":
        smooth = (smooth[0][:, :, :, :128], 128)
    elif bad == "smooth_dtype":
        smooth = (smooth[0].double(), 128)
    elif bad == "smooth_strides":
        smooth = (torch.zeros(b, h, 1, 512)[..., ::2], 128)
    kw = dict(lq=lq, lk=lk, group=group, out=out, p_rule=(True, 2, 0), pnq=True, scale=0.1, smooth_q=smooth)
    if bad is None:  # the good call builds its launch
        _, call = hopper.gluon_fwd_call((qc, qs), kx, vx, **kw)
        assert call.constants["SMOOTH_Q_BLOCK"] == 128 and call.grid == (1, b * h)
        assert call.constants["PRODUCER_REGS"] == hopper.PRODUCER_REGS_CORR and call.args[4] is smooth[0]
        return
    with pytest.raises(ValueError):
        hopper.gluon_fwd_call((qc, qs), kx, vx, **kw)


@pytest.mark.skipif(not hopper.HAS_GLUON, reason="this Triton has no Gluon")
def test_launch_stores_o_by_tma_where_it_can(monkeypatch):
    """O leaves by TMA (O_TMA) for 2-byte outputs whose strides a descriptor takes, the [B, L, H, D]
    view models hand over included, else by gl.store; OUT_TMA switches it off."""
    b, h, lq, lk = 1, 2, 100, 130
    q_packed = (torch.zeros(b, h, 128, 64, dtype=torch.uint8), torch.zeros(b, h, 128, 4, dtype=torch.uint8))
    kx = torch.zeros(b, h, 256, 128, dtype=torch.bfloat16)
    kw = dict(lq=lq, lk=lk, group=1, p_rule=(True, 2, 0), pnq=True, scale=0.1)

    def o_tma(out):
        return hopper.gluon_fwd_call(q_packed, kx, kx, out=out, **kw)[1].constants["O_TMA"]

    out = torch.empty(b, h, lq, 128, dtype=torch.bfloat16)
    blhd = torch.empty(b, lq, h, 128, dtype=torch.float16).transpose(1, 2)
    wide = torch.empty(b, h, lq, 136, dtype=torch.bfloat16)[..., :128]  # rows of 272 bytes: aligned
    odd = torch.empty(b, h, lq, 129, dtype=torch.bfloat16)[..., :128]  # rows of 258 bytes: not
    for o, want in ((out, True), (blhd, True), (wide, True), (odd, False), (out.float(), False)):
        assert o_tma(o) is want, (o.dtype, o.stride())
    monkeypatch.setattr(hopper, "OUT_TMA", False)
    assert o_tma(out) is False


# ---- H200 (sm_90): bit for bit against the tl kernel --------------------------------------------

gpu = pytest.mark.skipif(
    not _is_sm90(), reason="needs an sm_90 CUDA device with compiled (not interpreted) kernels"
)


def _operands(b, hq, hk, lq, lk, qk_elem, case, seed):
    """Pre-pass-shaped operands: packed Q^ (random codes, E8M0 bytes), bf16 K^ / V^ padded with zeros."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    lqp, lkp = -(-lq // 128) * 128, -(-lk // 128) * 128
    width = 128 if qk_elem == "e4m3" else 64
    qc = torch.randint(0, 256, (b, hq, lqp, width), generator=g, device="cuda", dtype=torch.int32).to(
        torch.uint8
    )
    qs = torch.randint(120, 134, (b, hq, lqp, 4), generator=g, device="cuda", dtype=torch.int32)
    if qk_elem == "e4m3":  # E4M3 codes 0x7F / 0xFF are NaN in OCP E4M3: keep finite codes here
        qc = torch.where((qc & 127) == 127, qc - 1, qc)
    k = torch.randn(b, hk, lkp, 128, generator=g, device="cuda")
    v = torch.randn(b, hk, lkp, 128, generator=g, device="cuda")
    if case == "outliers":
        k[..., 5] *= 300.0
        v[:, :, 7] *= 1e4
        qs[..., 0, :] = 140
    elif case == "ties":  # equal keys and equal scores: ties in every max
        k[:, :, 1::2] = k[:, :, 0::2]
        k[:, :, :, 64:] = 0.0
        qc[:, :, 3] = qc[:, :, 2]
    elif case == "zeros":
        k[:, :, :40] = 0.0
        qc[:, :, :50] = 0
        v[:, :, 60:90] = 0.0
    elif case == "nonfinite":
        qs[:, :, 9, 1] = 255  # a block that held NaN / Inf: decodes to NaN
        k[:, :, 17, 3] = float("inf")
        k[:, :, 18, 4] = float("-inf")
        v[:, :, 33, 8] = float("nan")
        v[:, :, 34, 9] = float("inf")
    elif case == "huge":  # block scales near the ends of E8M0
        qs[:, :, :64] = 250
        qs[:, :, 64:96] = 2
        k[:, :, :64] *= 1e30
    k[:, :, lk:] = 0.0  # the pre-pass pads with zeros
    v[:, :, lk:] = 0.0
    return (qc, qs.to(torch.uint8)), k.bfloat16(), v.bfloat16()


def _correction(b, hq, lq, lk, block, case, seed):
    """A Q smoothing correction [B, Hq, ceil(Lq / block), LKP] (fp32, zero past Lk, as
    `smoothing.smoothing_correction` leaves it): per-block offsets of either sign, and for case
    "nonfinite" one block of Inf / NaN (a query block that held them)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    lkp = -(-lk // 128) * 128
    corr = torch.randn(b, hq, -(-lq // block), lkp, generator=g, device="cuda") * 30.0
    corr[:, :, ::2] *= -0.01
    if case == "nonfinite" and corr.shape[2] > 1:
        corr[:, :, 1, 5] = float("inf")
        corr[:, :, 1, 6] = float("nan")
        corr[:, :, 1, 7] = float("-inf")
    if case == "huge":  # magnitudes at both ends where the three bf16 parts stay normal, and zeros
        corr[:, :, 0] *= 1e30
        corr[:, :, -1] *= 1e-20
        corr[:, :, :, 3] = 0.0
        corr[:, :, :, 4] = -0.0
    corr[..., lk:] = 0.0
    return corr


def _both(q_packed, kx, vx, *, lq, lk, group, out_dtype, rule, pnq, p_elem, qk_elem, scale, smooth_q=None):
    from mxattention.kernels.attention_fwd import mx_attention_fwd
    from mxattention.kernels.rules import rule_constants

    b, hq = q_packed[0].shape[:2]
    r = rule_constants(rule, p_elem)
    # E4M3 P~ by the hardware cast in both (targets.HW_E4M3_CAST lists sm_90).
    kw = dict(lq=lq, lk=lk, group=group, p_rule=(r.ceil, r.q_exp, r.q_mant), pnq=pnq, scale=scale,
              p_elem=p_elem, qk_elem=qk_elem, p_cvt=p_elem == "e4m3", smooth_q=smooth_q)  # fmt: skip
    out_tl = torch.full((b, hq, lq, 128), float("nan"), device="cuda", dtype=out_dtype)
    out_g = out_tl.clone()
    lse_tl = mx_attention_fwd(q_packed, kx, vx, dv=128, out=out_tl, block_n=128, matrix_path="bf16",
                              block_m=128, num_warps=8, num_stages=3, v_elem=p_elem, **kw)  # fmt: skip
    lse_g = hopper.mx_attention_fwd_hopper(q_packed, kx, vx, out=out_g, **kw)
    return (out_tl, lse_tl), (out_g, lse_g)


def _assert_bitwise(a: torch.Tensor, b: torch.Tensor, what: str):
    as_int = torch.int16 if a.element_size() == 2 else torch.int32
    ai, bi = a.view(as_int), b.view(as_int)
    differ = ai != bi
    assert not differ.any(), (
        f"{what}: {int(differ.sum())} of {a.numel()} differ, first at {differ.nonzero()[0].tolist()}"
    )


@gpu
@pytest.mark.parametrize(
    "lq,lk,hq,hk,case,rule,pnq,p_elem,qk_elem,out_dtype",
    [
        (300, 333, 2, 2, "outliers", "uos", True, "e2m1", "e2m1", torch.bfloat16),
        (128, 128, 4, 2, "ties", "ocp", False, "e2m1", "e2m1", torch.float16),
        (1000, 77, 2, 1, "zeros", 5.3, True, "e2m1", "e2m1", torch.float32),
        (200, 1025, 2, 2, "nonfinite", "uos", True, "e2m1", "e2m1", torch.bfloat16),
        (257, 640, 2, 2, "huge", "tfs", False, "e2m1", "e2m1", torch.float16),
        (333, 500, 4, 1, "outliers", "uos", True, "e4m3", "e2m1", torch.bfloat16),
        (129, 300, 2, 2, "ties", "ocp", False, "e4m3", "e2m1", torch.bfloat16),
        (190, 255, 2, 2, "outliers", "uos", True, "e4m3", "e4m3", torch.bfloat16),
    ],
)
def test_equals_tl_kernel_bit_for_bit(lq, lk, hq, hk, case, rule, pnq, p_elem, qk_elem, out_dtype):
    q_packed, kx, vx = _operands(1, hq, hk, lq, lk, qk_elem, case, seed=lq * 7 + lk)
    for scale in (128**-0.5, 37.0, 1e-7):
        (o_tl, l_tl), (o_g, l_g) = _both(q_packed, kx, vx, lq=lq, lk=lk, group=hq // hk, out_dtype=out_dtype,
                                         rule=rule, pnq=pnq, p_elem=p_elem, qk_elem=qk_elem, scale=scale)  # fmt: skip
        assert not torch.isnan(o_tl).all()
        _assert_bitwise(o_g, o_tl, f"O (scale {scale})")
        _assert_bitwise(l_g, l_tl, f"lse (scale {scale})")


@gpu
@pytest.mark.parametrize(
    "lq,lk,hq,hk,case,block,p_elem",
    [
        (300, 333, 2, 2, "outliers", 128, "e4m3"),
        (1000, 77, 2, 1, "zeros", 256, "e4m3"),
        (200, 1025, 4, 2, "nonfinite", 128, "e2m1"),
        (700, 1300, 2, 2, "huge", 384, "e4m3"),
        (257, 640, 2, 2, "ties", 128, "e4m3"),
    ],
)
def test_smoothing_correction_equals_tl_kernel(lq, lk, hq, hk, case, block, p_elem):
    """Q smoothing: the correction row as the QK wgmma's initial accumulator, made by a k16 wgmma of
    its three bf16 parts (which the producer writes), gives the `tl` kernel's bits (there
    `s + corr`, folded by Triton into the same accumulator), for blocks of 1-3 CTA tiles, Inf / NaN
    corrections, magnitudes 1e30 and 1e-20, zeros of both signs."""
    q_packed, kx, vx = _operands(2, hq, hk, lq, lk, "e2m1", case, seed=lq + 3 * lk)
    corr = _correction(2, hq, lq, lk, block, case, seed=lq)
    for scale in (128**-0.5, 3.0):
        (o_tl, l_tl), (o_g, l_g) = _both(q_packed, kx, vx, lq=lq, lk=lk, group=hq // hk, out_dtype=torch.bfloat16,
                                         rule="uos", pnq=True, p_elem=p_elem, qk_elem="e2m1", scale=scale,
                                         smooth_q=(corr, block))  # fmt: skip
        _assert_bitwise(o_g, o_tl, f"O (scale {scale})")
        _assert_bitwise(l_g, l_tl, f"lse (scale {scale})")
    # The correction is not ignored: without it the bits differ.
    (o_plain, _), _ = _both(q_packed, kx, vx, lq=lq, lk=lk, group=hq // hk, out_dtype=torch.bfloat16, rule="uos",
                            pnq=True, p_elem=p_elem, qk_elem="e2m1", scale=3.0)  # fmt: skip
    assert not torch.equal(o_plain, o_g)


@gpu
@pytest.mark.parametrize(
    "method,b,hq,hk,lq,lk,dtype",
    [
        ("mxattention-pv8-smooth", 2, 4, 2, 700, 900, torch.bfloat16),
        ("mxattention", 2, 4, 2, 700, 900, torch.bfloat16),
        ("mxfp4-ocp", 1, 3, 3, 129, 4000, torch.float16),
        ("mxattention-pv8", 1, 4, 1, 1500, 200, torch.bfloat16),
        ("mxfp8", 1, 2, 2, 256, 256, torch.bfloat16),
    ],
)
def test_fused_attention_same_bits_either_kernel(method, b, hq, hk, lq, lk, dtype):
    """The whole call (pre-pass + forward) through `fused_attention`: fwd_kernel "gluon" == "tl"."""
    from mxattention.attention.config import get_method
    from mxattention.kernels.fused import fused_attention

    g = torch.Generator(device="cuda").manual_seed(lq + lk)
    q = torch.randn(b, hq, lq, 128, generator=g, device="cuda").to(dtype)
    k = torch.randn(b, hk, lk, 128, generator=g, device="cuda").to(dtype)
    v = torch.randn(b, hk, lk, 128, generator=g, device="cuda").to(dtype)
    q[0, 0, 3] *= 40.0
    k[0, -1, 11] *= 40.0
    cfg = get_method(method)
    o_tl, l_tl, _ = fused_attention(q, k, v, cfg, scale=128**-0.5, fwd_kernel="tl")
    o_g, l_g, _ = fused_attention(q, k, v, cfg, scale=128**-0.5, fwd_kernel="gluon")
    _assert_bitwise(o_g, o_tl, "O")
    _assert_bitwise(l_g, l_tl, "lse")


@gpu
@pytest.mark.parametrize(
    "lq,lk,hq,hk,case,p_elem,qk_elem,out_dtype,out_layout",
    [
        (1000, 77, 4, 1, "zeros", "e2m1", "e2m1", torch.bfloat16, "blhd"),
        (129, 512, 4, 2, "nonfinite", "e4m3", "e2m1", torch.float16, "blhd"),
        (257, 640, 2, 2, "huge", "e2m1", "e2m1", torch.bfloat16, "odd"),
        (190, 255, 2, 2, "outliers", "e4m3", "e4m3", torch.float32, "bhld"),
    ],
)
def test_tma_store_epilogue_equals_tl_kernel(lq, lk, hq, hk, case, p_elem, qk_elem, out_dtype, out_layout):
    """O through shared memory by one TMA store per consumer (rows past Lq clipped), into the
    transposed [B, L, H, D] view as into [B, H, L, D]; outputs TMA cannot address (rows of 258 bytes,
    fp32) by gl.store: the tl kernel's bits either way, and the gl.store epilogue's."""
    q_packed, kx, vx = _operands(1, hq, hk, lq, lk, qk_elem, case, seed=lq * 3 + lk)
    (o_tl, l_tl), _ = _both(q_packed, kx, vx, lq=lq, lk=lk, group=hq // hk, out_dtype=out_dtype, rule="uos",
                            pnq=True, p_elem=p_elem, qk_elem=qk_elem, scale=128**-0.5)  # fmt: skip
    r = rule_constants("uos", p_elem)
    kw = dict(lq=lq, lk=lk, group=hq // hk, p_rule=(r.ceil, r.q_exp, r.q_mant), pnq=True, scale=128**-0.5,
              p_elem=p_elem, qk_elem=qk_elem, p_cvt=p_elem == "e4m3")  # fmt: skip
    if out_layout == "blhd":
        out = torch.full((1, lq, hq, 128), float("nan"), device="cuda", dtype=out_dtype).transpose(1, 2)
    elif out_layout == "odd":
        out = torch.full((1, hq, lq, 129), float("nan"), device="cuda", dtype=out_dtype)[..., :128]
    else:
        out = torch.full((1, hq, lq, 128), float("nan"), device="cuda", dtype=out_dtype)
    assert hopper.gluon_fwd_call(q_packed, kx, vx, out=out, **kw)[1].constants["O_TMA"] is (
        out_layout == "blhd"
    )
    lse = hopper.mx_attention_fwd_hopper(q_packed, kx, vx, out=out, **kw)
    assert not torch.isnan(o_tl).all()
    _assert_bitwise(out.contiguous(), o_tl, "O")
    _assert_bitwise(lse, l_tl, "lse")
