"""The fused kernel and `reference_attention` compute the same function (same block_n).

Both see bit-identical quantized operands (the pre-pass is exact), so they can differ only by
(1) the order of fp32 summation inside the two dots and of exp2 vs exp (a few ulps on S and P~), and
(2) the rare Q(P~) decisions that such ulps push across a rounding midpoint or a power-of-two
block boundary. Bounds, and the measured values they cover (interpreter, fp32 dots):

- rel-L2(O_kernel, O_ref) <= 1e-3 * rel-L2(O_ref, O_fp): the disagreement is at most a thousandth
  of the quantization error the method itself commits (measured: ~1e-7 against ~1e-1, i.e. 1e-6 of
  it). A flipped P~ decision moves one weight by one E2M1 step (<= 1/8 of its block max), which
  bounds a single flip's effect on a row by ~|V| / (8 l); a flip rate of 1e-3 would already stay
  under this bound, so the bound does not hide a systematic error (which moves every row).
- differing Q(P~) decisions <= 1e-3 of all decisions (measured: 0 on these cases);
- |lse_kernel - lse_ref| <= 1e-4 where finite on rows without a flipped decision; a flip moves l by
  at most one E2M1 step, less than 0.6 (the row max contributes 1 to l >= 1), so rows with f flips
  get 1e-4 + 0.6 f; identical -inf rows, O = 0 on rows with no key.
"""

import math

import pytest
import torch

from mxattention.attention.config import AttentionConfig, QuantSpec, get_method

from .helpers import compare, qkv, skip_unless_path_runs

REL_OF_QUANT = 1e-3
DECISION_RATE = 1e-3
_MX4, _MX8 = QuantSpec.mx("e2m1"), QuantSpec.mx("e4m3")


def _check(c, label=""):
    print(
        f"{label}: rel-L2 {c.rel_l2:.2e} (quant err {c.quant_rel_l2:.2e}), lse {c.lse_max_abs:.1e}, "
        f"P decisions differing {c.p_differ}/{c.p_decisions}"
    )
    assert torch.isfinite(c.out).all()
    assert c.rel_l2 <= REL_OF_QUANT * c.quant_rel_l2
    assert c.p_differ <= DECISION_RATE * c.p_decisions
    # A flipped decision moves l by at most one E2M1 step (< 0.6 of the row max's 1), and l >= 1.
    assert c.lse_max_abs <= 1e-4 + 0.6 * c.max_row_flips
    assert torch.equal(torch.isneginf(c.lse), torch.isneginf(c.ref_lse))
    empty = torch.isneginf(c.ref_lse)
    assert (c.out[empty] == 0).all()


@pytest.mark.parametrize(
    "method,d,lq,lk",
    [
        ("mxattention", 64, 150, 200),
        ("mxfp4-ocp", 128, 70, 300),
        ("mxfp4-ocp-hadamard-pnq", 32, 33, 129),
        ("mxattention-pv8", 64, 150, 200),
        ("mxfp8", 80, 70, 150),
    ],
)
def test_matches_reference(method, d, lq, lk, device):
    q, k, v = qkv(1, 2, 2, lq, lk, d, seed=d)
    _check(compare(q, k, v, method, device=device), method)


def test_causal(device):
    q, k, v = qkv(1, 2, 2, 130, 130, 64, seed=1)
    _check(compare(q, k, v, "mxattention", is_causal=True, device=device, block_m=64), "causal")


def test_causal_lq_ne_lk(device):
    q, k, v = qkv(1, 1, 1, 90, 200, 64, seed=2)
    _check(compare(q, k, v, "mxfp4-ocp", is_causal=True, device=device, block_m=64), "causal lq<lk")


def test_key_padding_mask_hunyuan(device):
    # HunyuanVideo's boolean key mask [B, 1, 1, Lk]; batch 1 masks every key (rows with no key).
    q, k, v = qkv(2, 2, 2, 70, 140, 64, seed=3)
    mask = torch.ones(2, 1, 1, 140, dtype=torch.bool)
    mask[0, ..., 100:] = False
    mask[1] = False
    c = compare(q, k, v, "mxattention", mask=mask, device=device)
    _check(c, "key mask")
    assert torch.isneginf(c.lse[1]).all() and (c.out[1] == 0).all()


def test_general_bool_mask(device):
    q, k, v = qkv(1, 2, 2, 65, 100, 64, seed=4)
    g = torch.Generator().manual_seed(4)
    mask = torch.rand(1, 2, 65, 100, generator=g) > 0.4
    mask[0, 1, 7] = False  # one fully masked row
    _check(compare(q, k, v, "mxattention", mask=mask, device=device), "bool mask")


def test_additive_mask(device):
    q, k, v = qkv(1, 2, 2, 40, 96, 64, seed=5)
    g = torch.Generator().manual_seed(5)
    mask = torch.randn(1, 1, 40, 96, generator=g) * 3
    mask[..., 50:60] = -float("inf")
    _check(compare(q, k, v, "mxfp4-ocp-hadamard", mask=mask, device=device), "additive")


def test_gqa_ragged(device):
    q, k, v = qkv(1, 4, 2, 45, 77, 64, seed=6)
    _check(compare(q, k, v, "mxattention", device=device), "gqa")


def test_padded_head_dim_other_rules_and_tiles(device):
    cfg = get_method("mxfp4-tfs-hadamard-pnq").with_tiles(block_n=64)
    q, k, v = qkv(1, 1, 1, 50, 150, 80, dv=48, seed=7)
    _check(compare(q, k, v, cfg, device=device), "d=80 dv=48 tfs bn=64")


def test_half_inputs(device):
    q, k, v = qkv(1, 2, 2, 40, 64, 64, seed=8, dtype=torch.bfloat16)
    _check(compare(q, k, v, "mxattention", device=device), "bf16 in")


# Each method once and each layout for E2M1 and E4M3 K^ / V^ (the layouts against the reference for
# every method: test_extreme_block_scales, test_nonfinite_inputs_as_reference).
@pytest.mark.parametrize(
    "layout,method", [("bf16", "mxattention"), ("packed", "mxattention-pv8"), ("packed", "mxfp8")]
)
def test_matrix_paths_agree(layout, method, device):
    """dot_scaled on bytes, and the bf16 path on bytes or bf16 K^, V^: the same function."""
    q, k, v = qkv(1, 2, 2, 64, 160, 64, seed=9)
    a = compare(q, k, v, method, device=device, matrix_path="dot_scaled")
    b = compare(q, k, v, method, device=device, matrix_path="bf16", kv_layout=layout)
    _check(a, "dot_scaled")
    _check(b, f"bf16/{layout}")
    rel = ((a.out - b.out).norm() / a.out.norm()).item()
    print(f"paths: rel-L2 {rel:.2e}")
    assert rel <= 1e-5
    assert int((a.lse != b.lse).sum()) <= a.lse.numel() // 100


@pytest.mark.parametrize("path", ["bf16", "dot_scaled"])
def test_full_and_masked_tiles(path, device):
    """Tiles below the causal diagonal and before the padded tail take the unmasked fast path, the
    others the masked one; both paths and their hand-over agree with the reference (block_n 32:
    many tiles of each kind per program)."""
    cfg = get_method("mxattention").with_tiles(block_n=32)
    q, k, v = qkv(1, 2, 2, 200, 200, 64, seed=13)
    _check(compare(q, k, v, cfg, is_causal=True, matrix_path=path, block_m=64, device=device), "causal")
    q, k, v = qkv(1, 2, 2, 70, 250, 64, seed=14)
    _check(compare(q, k, v, cfg, matrix_path=path, device=device), "tail")
    mask = torch.rand(1, 2, 70, 250, generator=torch.Generator().manual_seed(1)) > 0.3
    _check(compare(q, k, v, cfg, mask=mask, matrix_path=path, device=device), "bool mask")


# Not causal in chunks of one KV head (3 chunks), causal in chunks of two (2 + 1, uneven).
@pytest.mark.parametrize("is_causal,heads", [(False, 1), (True, 2)])
def test_kv_head_chunks_change_nothing(is_causal, heads, device):
    """The bf16 layout's head chunks (a memory bound) give the very same O, lse and Q(P~) as one
    launch: GQA groups stay whole, the mask and the outputs are sliced per chunk, batches kept."""
    from mxattention.kernels.fused import fused_attention

    q, k, v = qkv(2, 6, 3, 70, 100, 64, seed=9)  # one key tile: the chunks are what is tested
    mask = torch.rand(2, 1, 1, 100, generator=torch.Generator().manual_seed(9)) > 0.2
    mask = mask.expand(2, 6, 70, 100).to(device)
    cfg = get_method("mxattention")
    args = dict(
        mask=mask, is_causal=is_causal, scale=0.125, matrix_path="bf16", kv_layout="bf16", debug_p=True
    )
    q, k, v = q.to(device), k.to(device), v.to(device)
    whole = fused_attention(q, k, v, cfg, kv_chunk_bytes=None, **args)
    # One KV head's K^ + V^ (2 batches, 128 padded keys, 64 + 64 columns, bf16) is 65536 bytes.
    parts = fused_attention(q, k, v, cfg, kv_chunk_bytes=heads * 65536, **args)
    for a, b in zip(whole, parts, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("layout", ["packed", "bf16"])
def test_grid_limit_pieces_change_nothing(layout, device, monkeypatch):
    """Past CUDA's 65535 on the grid's batch x heads axis the call runs in pieces of batches and
    heads (here a limit of 4 against 2 batches x 6 query heads): the same O, lse and Q(P~)."""
    from mxattention.kernels import attention_fwd as fwd
    from mxattention.kernels import fused, plan

    q, k, v = qkv(2, 6, 3, 40, 100, 64, seed=4)
    mask = (torch.rand(2, 1, 1, 100, generator=torch.Generator().manual_seed(4)) > 0.2).expand(2, 6, 40, 100)
    q, k, v, mask = q.to(device), k.to(device), v.to(device), mask.to(device)
    cfg = get_method("mxattention")
    # One stream: on an sm_90 GPU two would halve the pieces (test_chunk_streams.py covers them).
    args = dict(mask=mask, scale=0.125, matrix_path="bf16", kv_layout=layout, debug_p=True, chunk_streams=1)
    whole = fused.fused_attention(q, k, v, cfg, **args)
    launches = []
    real = fwd.mx_attention_fwd

    def counted(qp, *a, **kw):
        launches.append(kw["out"].shape[:2])
        return real(qp, *a, **kw)

    monkeypatch.setattr(fwd, "mx_attention_fwd", counted)
    monkeypatch.setattr(plan, "GRID_Y_MAX", 4)
    parts = fused.fused_attention(q, k, v, cfg, **args)
    # GQA groups of 2 query heads stay whole: 2 KV heads (4 query heads) a piece, one batch each.
    assert launches == [(1, 4), (1, 2)] * 2
    for a, b in zip(whole, parts, strict=True):
        assert torch.equal(a, b)


def test_kv_heads_per_chunk():
    from mxattention.kernels.fused import kv_heads_per_chunk
    from mxattention.kernels.plan import KV_CHUNK_MIN_BYTES

    per_head = 2 * 1 * 16384 * (128 + 128)
    assert kv_heads_per_chunk(1, 40, 16384, 128, 128, None) == 40
    assert kv_heads_per_chunk(1, 40, 16384, 128, 128, 3 * per_head) == 3
    assert kv_heads_per_chunk(1, 40, 16384, 128, 128, 19 * per_head) == 14  # 3 balanced chunks, not 19+19+2
    assert kv_heads_per_chunk(1, 40, 16384, 128, 128, 1) == 1  # never fewer than one head
    # "auto": max(KV_CHUNK_MIN_BYTES, the packed K/V bytes); small calls run in one chunk.
    assert kv_heads_per_chunk(1, 40, 4096, 128, 128) == 40
    assert KV_CHUNK_MIN_BYTES // per_head == 32
    assert kv_heads_per_chunk(1, 40, 16384, 128, 128) == 20  # two balanced chunks, not 32 + 8
    big = kv_heads_per_chunk(1, 40, 75648, 128, 128)
    assert 2 * 75648 * 256 * big <= 40 * 75648 * 256 * (0.5 + 1 / 32)
    # On a GPU also 1/64 of its memory: the H200's 141 GiB hold Wan 14B's 75k K^ + V^ in one chunk,
    # a 24 GiB card's 384 MiB the 16k call's (320 MiB).
    assert kv_heads_per_chunk(1, 40, 75648, 128, 128, device_bytes=150_000_000_000) == 40
    assert kv_heads_per_chunk(1, 40, 75648, 128, 128, device_bytes=24 * 2**30) == big
    assert kv_heads_per_chunk(1, 40, 16384, 128, 128, device_bytes=24 * 2**30) == 40
    assert kv_heads_per_chunk(1, 40, 16384, 128, 128, device_bytes=16 * 2**30) == 20
    for bad in (0, -5, 1.5, "big", True):
        with pytest.raises(ValueError, match="kv_chunk_bytes"):
            kv_heads_per_chunk(1, 40, 4096, 128, 128, bad)


# MXFP8 E4M3 P~ and V (issue 16), and the two mixed ladders: the kernels take each operand's own.
PV8_MIXED = [
    AttentionConfig("v8-p4", _MX4, _MX4, _MX8, _MX4, hadamard=True, pnq=True),
    AttentionConfig("v4-p8-ocp", _MX4, _MX4, QuantSpec.mx("e2m1", "ocp"), QuantSpec.mx("e4m3", "ocp")),
    AttentionConfig("qk8-pv4", _MX8, _MX8, _MX4, _MX4, hadamard=True, pnq=True),
]


@pytest.mark.parametrize("cfg", PV8_MIXED, ids=lambda c: c.name)
def test_mixed_ladders(cfg, device):
    q, k, v = qkv(1, 2, 1, 70, 100, 32, seed=21)
    _check(compare(q, k, v, cfg, device=device), cfg.name)
    _check(compare(q, k, v, cfg, device=device, matrix_path="bf16", kv_layout="packed"), cfg.name)


@pytest.mark.parametrize("path", ["bf16", "dot_scaled"])
def test_pv8_causal_tiles_and_tiny_p_blocks(path, device):
    """mxattention-pv8 with causal and padded tiles (block_n 32), and with key blocks pushed 121 to
    128 binades under the row max by an additive mask, so P~ blocks take scales 2**-121 to the clamp
    2**-127: their E4M3 normals are fp32 subnormals (`cast.elem_round` rounds them in the scaled
    domain; rounding p itself left them unrounded). P~ elements below 2**-126 are 0 in both (the
    exps flush, docs/design.md, 'Special values and overflow': on the H200 the kernel's exp2 does,
    on the interpreter `cast.exp2_ftz` selects): the last block is all zeros, the one 125.5 binades
    down partly (no block sits at 126, where the row of tied scores would meet the threshold
    within an ulp). Every Q(P~) decision equals the reference's."""
    cfg = get_method("mxattention-pv8").with_tiles(block_n=32)
    q, k, v = qkv(1, 2, 2, 100, 150, 64, seed=22)
    c = compare(q, k, v, cfg, is_causal=True, matrix_path=path, block_m=64, device=device)
    _check(c, f"pv8 causal {path}")
    assert c.p_differ == 0
    q, k, v = qkv(1, 2, 2, 40, 160, 64, seed=23, outliers=False)
    mask = torch.zeros(1, 1, 40, 160)
    for i, binades in enumerate((121.5, 124.0, 125.5, 127.5)):  # keys 32 (i + 1) .. 32 (i + 2)
        mask[..., 32 * (i + 1) : 32 * (i + 2)] = -binades * math.log(2.0)
    c = compare(q, k, v, cfg, mask=mask, scale=0.05, matrix_path=path, device=device)
    _check(c, f"pv8 tiny p {path}")
    assert c.p_differ == 0


@pytest.mark.parametrize("path,layout", [("dot_scaled", None), ("bf16", "bf16")])
def test_q_smoothing_as_reference(path, layout, device):
    """mxattention-pv8-smooth: Q minus each 128-query block's mean in the Q^ pass, qm K^T * scale added
    to every tile's scores. Q = N(0, 1) + 2 (issue 16's case, where smoothing must help), 200
    queries (a ragged last block), GQA, causal with 64-row tiles (two programs per block), an
    additive mask (scaled scores take both terms)."""
    cfg = get_method("mxattention-pv8-smooth")
    q, k, v = qkv(1, 2, 1, 200, 200, 64, seed=24, outliers=False)
    q = q + 2.0
    c = compare(q, k, v, cfg, matrix_path=path, kv_layout=layout, device=device)
    _check(c, f"smooth {path}")
    plain = compare(q, k, v, "mxattention-pv8", matrix_path=path, kv_layout=layout, device=device)
    assert c.quant_rel_l2 < 0.7 * plain.quant_rel_l2  # smoothing helps here, as in the reference
    c = compare(q, k, v, cfg, is_causal=True, block_m=64, matrix_path=path, kv_layout=layout, device=device)
    _check(c, f"smooth causal {path}")
    mask = torch.randn(1, 1, 200, 200, generator=torch.Generator().manual_seed(24))
    mask[..., 150:170] = -float("inf")
    _check(compare(q, k, v, cfg, mask=mask, matrix_path=path, kv_layout=layout, device=device), "smooth mask")


@pytest.mark.parametrize("path,layout", [("dot_scaled", "packed"), ("bf16", "bf16")])
def test_q_smoothing_head_chunks_change_nothing(path, layout, device, monkeypatch):
    """The correction buffer (4 ceil(Lq / 128) bytes per key and query head) bounds the head chunks
    too, on either layout: chunks of one KV head give the very same O, lse and Q(P~) as one launch."""
    from mxattention.kernels import attention_fwd, fused

    skip_unless_path_runs(path, device)
    q, k, v = (t.to(device) for t in qkv(1, 4, 2, 200, 100, 64, seed=25))
    cfg = get_method("mxattention-pv8-smooth")
    args = dict(scale=0.125, matrix_path=path, kv_layout=layout, debug_p=True)
    whole = fused.fused_attention(q, k, v, cfg, **args, kv_chunk_bytes=None)
    launches = []
    real = attention_fwd.mx_attention_fwd

    def counted(*a, **kw):
        launches.append(kw["out"].shape[1])
        return real(*a, **kw)

    monkeypatch.setattr(attention_fwd, "mx_attention_fwd", counted)
    if layout == "packed":  # (bf16 K^ + V^ of one head take more than these bounds)
        fused.fused_attention(q, k, v, cfg, **args, kv_chunk_bytes=4096)
        assert launches == [4]  # two KV heads' corrections: 2 x 4 bytes x 2 query heads x 2 blocks x 128 keys
        launches.clear()
    parts = fused.fused_attention(q, k, v, cfg, **args, kv_chunk_bytes=4095)
    assert launches == [2, 2]  # query heads per launch
    for a, b in zip(whole, parts, strict=True):
        assert torch.equal(a, b)


def test_q_smoothing_head_chunks_of_several_batches(device):
    """Head chunks of a batch of 2 (batches with different query means): each chunk's Q^ pass reads
    its own rows of the block means (a [2, 2 of 4 heads] view of them is not contiguous), so the
    chunks give the bits of one launch."""
    from mxattention.kernels import fused, plan

    q, k, v = (t.to(device) for t in qkv(2, 4, 2, 200, 100, 64, seed=26))
    q = q + torch.tensor([0.0, 3.0], device=device).view(2, 1, 1, 1)
    cfg = get_method("mxattention-pv8-smooth")
    args = dict(scale=0.125, matrix_path="bf16", kv_layout="bf16")
    p = plan.plan_call(cfg, q, k, v, **args, kv_chunk_bytes=4095)
    assert [(c.batches, c.kv_heads) for c in p.chunks] == [((0, 2), (0, 1)), ((0, 2), (1, 2))]
    whole = fused.fused_attention(q, k, v, cfg, **args, kv_chunk_bytes=None)
    parts = fused.run_plan(p, q, k, v)
    assert torch.equal(whole.out, parts.out) and torch.equal(whole.lse, parts.lse)


@pytest.mark.parametrize("layout", ["packed", "bf16"])
def test_extreme_block_scales(layout, device):
    """Blocks at the ends of the E8M0 range decode exactly: Q rows and V columns near 1e36 (scale
    2**118, above the 2**113 that one fp16-trick factor reaches), K near 1e-36 so the scores stay
    moderate, and tiny V columns (subnormal products)."""
    for method in ("mxattention", "mxattention-pv8", "mxfp8"):
        q, k, v = qkv(1, 2, 2, 40, 96, 64, seed=15)
        q[:, :, 5:9] *= 1e36
        k *= 1e-36
        v[..., 3] *= 1e36
        v[..., 7] *= 1e-36
        c = compare(q, k, v, method, device=device, matrix_path="bf16", kv_layout=layout)
        _check(c, f"extreme scales, {method}, {layout} K/V")


NONFINITE = {
    "q_nan": (0, (3, 10), float("nan")),
    "q_inf": (0, (4, 20), float("inf")),
    "k_nan": (1, (50, 5), float("nan")),
    "k_inf": (1, (50, 5), -float("inf")),
    "v_inf": (2, (60, 7), float("inf")),
    "v_nan": (2, (60, 7), float("nan")),
}


NONFINITE_RUNS = [
    (case, "mxattention", path, layout)
    for case in sorted(NONFINITE)
    for path, layout in [("bf16", "packed"), ("bf16", "bf16"), ("dot_scaled", None)]
] + [
    (case, method, path, layout)
    for method, cases in (("mxattention-pv8", ("q_nan", "v_inf", "v_nan")), ("mxfp8", ("q_inf", "k_nan")))
    for case in cases
    for path, layout in [("bf16", "bf16"), ("dot_scaled", None)]
]


@pytest.mark.parametrize("case,method,path,layout", NONFINITE_RUNS)
def test_nonfinite_inputs_as_reference(case, method, path, layout, device):
    """NaN / Inf in Q, K or V: the outputs and lse are NaN / Inf exactly where the reference's are
    (an MX block holding one becomes NaN; a NaN score stays NaN through the P~ cast's saturation),
    and the finite rows agree."""
    from mxattention.attention.reference import reference_attention
    from mxattention.kernels.fused import fused_attention

    skip_unless_path_runs(path, device)
    which, (row, col), value = NONFINITE[case]
    qkv_ = list(qkv(1, 1, 1, 40, 96, 64, seed=16))
    qkv_[which][0, 0, row, col] = value
    q, k, v = qkv_
    cfg = get_method(method)
    ref, ref_lse = reference_attention(q, k, v, cfg, scale=0.125)
    out, lse, _ = fused_attention(
        q.to(device), k.to(device), v.to(device), cfg, scale=0.125, matrix_path=path, kv_layout=layout
    )
    out, lse = out.float().cpu(), lse.cpu()
    assert ref.isnan().any()  # the case is not vacuous
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), ref.isinf())
    assert torch.equal(lse.isnan(), ref_lse.isnan()) and torch.equal(lse.isinf(), ref_lse.isinf())
    fin = torch.isfinite(ref)
    assert torch.allclose(out[fin], ref[fin], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "scale,lq,lk",
    [(0.0, 37, 45), (-0.0, 37, 128), (1e-50, 37, 45), (-0.125, 37, 45), (-0.125, 37, 128), (-2.0, 70, 45)],
)
def test_any_finite_scale_as_reference(scale, lq, lk, device):
    """scale <= 0 (and one whose fp32 constant scale * log2(e) underflows): the kernel takes row
    maxima of the raw scores times that constant, so it is served by negating or zeroing the
    smaller operand (lq > lk: K). Zero scores are uniform weights; a padded tile (lk = 45) used to
    give NaN everywhere, a negative scale finite and wrong results."""
    q, k, v = qkv(1, 2, 1, lq, lk, 32, seed=17)
    c = compare(q, k, v, "mxattention", scale=scale, device=device)
    _check(c, f"scale {scale}")
    if scale == 0.0:  # uniform weights: lse = log(sum of the quantized ones) = log(lk)
        assert torch.allclose(c.lse, torch.full_like(c.lse, math.log(lk)), atol=1e-5)


def test_scale_beyond_the_kernels_fp32_constant():
    from mxattention.kernels.fused import fused_attention, scale_reason

    assert scale_reason(-0.5) is None and scale_reason(2.3e38) is None
    for bad in (2.4e38, -1e39, float("inf"), float("nan")):
        assert "fp32 range" in scale_reason(bad)
    q, k, v = qkv(1, 1, 1, 8, 8, 32, seed=18)
    with pytest.raises(ValueError, match="fp32 range"):
        fused_attention(q, k, v, get_method("mxattention"), scale=1e39)


@pytest.mark.parametrize("method", ["mxattention", "mxfp4-ocp", "mxattention-pv8"])
@pytest.mark.parametrize("magnitude", [1.7e8, 3.6e10, 1e30])
def test_large_scores_as_reference(method, magnitude, device):
    """Scores of any finite magnitude: the row max gets P~ = 1 as in the reference. One fma per P~
    element left exp2 of the rounding error of s * scale * log2(e) there, >= 2**-8 (all of the
    row rounded to 0: O = 0, lse = -inf) or overflowing (NaN) from |S| ~ 1e8 on."""
    q, k, v = qkv(1, 1, 1, 37, 96, 32, seed=19)
    q = q * (magnitude / (q @ k.transpose(-1, -2) * 32**-0.5).abs().max())
    c = compare(q, k, v, method, device=device)
    assert torch.isfinite(c.lse).all() and torch.isfinite(c.ref_lse).all()
    assert c.rel_l2 <= REL_OF_QUANT * c.quant_rel_l2 and c.p_differ <= DECISION_RATE * c.p_decisions
    # lse ~ the row max: the kernel's m is an fp32 of the scores in log2 units, times ln 2.
    assert ((c.lse - c.ref_lse).abs() <= 1e-4 + 2.0**-21 * c.ref_lse.abs()).all()


@pytest.mark.parametrize(
    "method,path,layout",
    [
        ("mxattention", "bf16", "bf16"),
        ("mxattention", "dot_scaled", None),
        ("mxattention-pv8", "bf16", "bf16"),
    ],
)
@pytest.mark.parametrize("value", [6e4, 65504.0])
def test_fp16_output_near_max_saturates_as_reference(value, method, path, layout, device):
    """fp16 V at +-6e4 / 65504 (quantized to 65536 under UOS): the kernel's output is finite and
    equals the reference's saturated cast (on a GPU the kernel's own fp16 store saturates)."""
    from mxattention.attention.sdpa import sdpa_reference
    from mxattention.kernels.fused import fused_attention

    skip_unless_path_runs(path, device)
    q, k, _ = qkv(1, 2, 2, 16, 40, 32, seed=20, dtype=torch.float16)
    v = torch.full((1, 2, 40, 32), value, dtype=torch.float16)
    v[..., ::2] *= -1
    ref = sdpa_reference(q, k, v, method=method, scale=32**-0.5)
    out, _, _ = fused_attention(
        q.to(device), k.to(device), v.to(device), get_method(method), scale=32**-0.5,
        matrix_path=path, kv_layout=layout,
    )  # fmt: skip
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    assert torch.equal(out.cpu(), ref)
