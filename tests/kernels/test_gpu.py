"""GPU-only checks (skipped without CUDA): large shapes vs the reference, compile, CUDA graphs."""

import warnings

import pytest
import torch

import mxattention as mx
from mxattention.kernels import builds
from mxattention.kernels._triton import tl, triton
from mxattention.kernels.cast import e4m3_round, e4m3_round_hw
from mxattention.ops import errors as op

from .helpers import compare, qkv, skip_unless_path_runs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize(
    "method,path,layout",
    [
        ("mxattention", "bf16", "bf16"),
        ("mxattention", "bf16", "packed"),
        ("mxattention", "dot_scaled", "packed"),
        ("mxattention-pv8", "bf16", "bf16"),
        ("mxattention-pv8", "bf16", "packed"),
        ("mxattention-pv8", "dot_scaled", "packed"),
        ("mxattention-pv8-smooth", "bf16", "bf16"),
        ("mxattention-pv8-smooth", "dot_scaled", "packed"),
        ("mxfp8", "bf16", "bf16"),
    ],
)
def test_large_matches_reference(method, path, layout):
    # Before sm_100 Triton emulates tl.dot_scaled (bf16 upcast): slower, same function.
    q, k, v = qkv(1, 4, 4, 2048, 2048, 128, seed=11)
    c = compare(q, k, v, method, device="cuda", matrix_path=path, kv_layout=layout)
    assert c.rel_l2 <= 1e-3 * c.quant_rel_l2
    assert c.p_differ <= 1e-3 * c.p_decisions


def test_batch_heads_past_the_grid_limit():
    """B x H = 65540 > 65535 (CUDA's second grid axis): the public function runs in pieces on the
    kernels, with no fallback, and each batch's O equals the same batch computed alone."""
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(16385, 4, 40, 64, device="cuda", generator=g).bfloat16() for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error", op.ReferenceFallbackWarning)
        out = mx.scaled_dot_product_attention(q, k, v)
        for i in (0, 7777, 16384):
            alone = mx.scaled_dot_product_attention(q[i : i + 1], k[i : i + 1], v[i : i + 1])
            assert torch.equal(out[i : i + 1], alone)
    assert torch.isfinite(out).all()


def test_compile_and_cuda_graph():
    q, k, v = (t.cuda().half() for t in qkv(1, 8, 8, 1024, 1024, 128, seed=12))
    with warnings.catch_warnings():
        warnings.simplefilter("error", op.ReferenceFallbackWarning)
        eager = mx.scaled_dot_product_attention(q, k, v)
        compiled = torch.compile(lambda q, k, v: mx.scaled_dot_product_attention(q, k, v), fullgraph=True)
        assert torch.equal(compiled(q, k, v), eager)
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            mx.scaled_dot_product_attention(q, k, v)  # warm up (compilation) outside the capture
            with torch.cuda.graph(graph):
                captured = mx.scaled_dot_product_attention(q, k, v)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager)


@pytest.mark.parametrize("rule", ["uos", "ocp", 5.3])
@pytest.mark.parametrize("case", ["outliers", "nonfinite", "blhd", "many_tiles", "fp16"])
def test_gluon_k_pass_equals_tl_kernel(case, rule, monkeypatch):
    """The pipelined Gluon K^ pass writes the `tl` kernel's bf16 values bit for bit (and so
    fake_quantize(rotate(k))'s)."""
    from mxattention.formats.mx import fake_quantize
    from mxattention.kernels import prepass_hopper
    from mxattention.kernels.prepass import prepass_qk
    from mxattention.rotation import rotate

    if torch.cuda.get_device_capability() != (9, 0) or not prepass_hopper.HAS_GLUON:
        pytest.skip("the Gluon pass runs on sm_90")
    g = torch.Generator(device="cuda").manual_seed(len(case))
    b, h, n = (1, 40, 4096) if case == "many_tiles" else (2, 3, 1000)  # 1280 tiles; a ragged last tile
    x = torch.randn((b, h, n, 128), device="cuda", generator=g) * torch.exp(
        2 * torch.randn(128, device="cuda", generator=g)
    )
    x[..., 7::50, :3] = 0.0
    x[..., 11::97, 5] *= 1e30
    if case == "nonfinite":
        x[0, 0, 3, 5], x[0, 1, 40, 1], x[1, 2, 999, 0] = float("nan"), float("inf"), -float("inf")
    if case == "blhd":  # the same values stored as [B, L, H, D]
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    x = x.clamp(-6e4, 6e4).half() if case == "fp16" else x.bfloat16()
    assert prepass_hopper.usable(x, 1024 if n == 1000 else n, hadamard=True)
    # This test's builds only (another test's recorded tl forward fallback is not a Gluon pass's).
    monkeypatch.setattr(builds, "FAILURES", {})
    fast = prepass_qk(x, rule, hadamard=True, out_bf16=True)
    assert not builds.FAILURES  # the Gluon pass built (else the planner fell back to tl)
    monkeypatch.setattr(prepass_hopper, "usable", lambda *a, **k: False)
    slow = prepass_qk(x, rule, hadamard=True, out_bf16=True)
    assert torch.equal(fast.view(torch.int16), slow.view(torch.int16))
    want = fake_quantize(rotate(x.float()), -1, rule=rule)
    got = fast[..., :n, :].float()
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
    assert (fast[..., n:, :] == 0).all()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # torch's butterflies overflow to Inf, as the kernel's
@pytest.mark.parametrize("rule", ["uos", "ocp", "tfs", 5.3])
@pytest.mark.parametrize("case", ["outliers", "nonfinite", "blhd", "many_tiles", "long", "extreme", "hard"])
def test_gluon_q_pass_equals_mx_quantize(case, rule, monkeypatch):
    """The split-row Gluon Q^ pass writes mx_quantize(rotate(q))'s bytes, as the `tl` kernel does:
    two lanes per row and a shuffle for the last butterfly level change nothing. "extreme" puts
    blocks on both sides of the folded scale's exact range (cast.cast_packed's per-tile fallback);
    "long" gives each persistent program several tiles, so its TMA ring wraps around (phases 0, 1,
    0, ...), with a ragged last tile that TMA fills with zeros."""
    from mxattention.formats.ladders import E2M1
    from mxattention.formats.mx import mx_quantize
    from mxattention.kernels import prepass_hopper
    from mxattention.kernels.prepass import prepass_qk
    from mxattention.rotation import rotate
    from tests.formats.hard_values import hard_values

    if torch.cuda.get_device_capability() != (9, 0) or not prepass_hopper.HAS_GLUON:
        pytest.skip("the Gluon pass runs on sm_90")
    g = torch.Generator(device="cuda").manual_seed(len(case))
    b, h, n = {"many_tiles": (1, 40, 4096), "long": (1, 40, 8200)}.get(
        case, (2, 3, 1000)
    )  # ragged last tiles
    x = torch.randn((b, h, n, 128), device="cuda", generator=g) * torch.exp(
        2 * torch.randn(128, device="cuda", generator=g)
    )
    x[..., 7::50, :3] = 0.0
    x[..., 9::50, :] = -0.0
    if case == "nonfinite":
        x[0, 0, 3, 5], x[0, 1, 40, 1], x[1, 2, 999, 0] = float("nan"), float("inf"), -float("inf")
    if case == "blhd":  # the same values stored as [B, L, H, D]
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    if case == "extreme":  # each row its own power of two: 2**-150 (subnormal) .. 2**127 per head
        for head, (lo, hi) in enumerate(((10, 30), (-150, -110), (100, 127))):
            k = torch.randint(lo, hi + 1, (n, 1), device="cuda", generator=g).float()
            x[:, head] = x[:, head] * torch.exp2(k)
    if case == "hard":  # ties, powers of two, rule boundaries and their neighbours, as bf16
        x[0, 0, :64] = hard_values(E2M1, 64 * 128, seed=5).view(64, 128).cuda()
    x = x.bfloat16()
    lp = -(-n // 128) * 128
    assert prepass_hopper.usable_q(x, lp, hadamard=True)
    codes, scales = prepass_qk(x, rule, hadamard=True)
    assert not builds.FAILURES  # the Gluon pass built (else the planner fell back to tl)
    ref = mx_quantize(rotate(x.float()), axis=-1, rule=rule)
    assert torch.equal(codes[..., :n, :], ref.data) and torch.equal(scales[..., :n, :], ref.scales)
    assert (codes[..., n:, :] == 0).all() and (scales[..., n:, :] == 127).all()
    monkeypatch.setattr(prepass_hopper, "usable_q", lambda *a, **k: False)
    slow = prepass_qk(x, rule, hadamard=True)
    assert torch.equal(codes, slow[0]) and torch.equal(scales, slow[1])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # torch's butterflies overflow to Inf, as the kernel's
@pytest.mark.parametrize("case", ["ragged", "long", "nonfinite"])
def test_gluon_q_pass_with_smoothing_equals_tl_kernel(case, monkeypatch):
    """Q smoothing on the Gluon Q^ pass: fp32 x - qm of each row's 128-row block before the
    rotation, bit for bit mx_quantize(rotate(q - qm)) and the `tl` pass's bytes; a ragged last
    block (its padding rows: zero codes, scale byte 127), "long": each persistent program's TMA ring
    wraps around over tiles of many blocks, "nonfinite": NaN / Inf rows (their blocks' means too)."""
    from mxattention.attention.operands import q_block_mean_rows, q_block_means
    from mxattention.formats.mx import mx_quantize
    from mxattention.kernels import prepass_hopper
    from mxattention.kernels.prepass import prepass_qk, qk_pass
    from mxattention.rotation import rotate

    if torch.cuda.get_device_capability() != (9, 0) or not prepass_hopper.HAS_GLUON:
        pytest.skip("the Gluon pass runs on sm_90")
    g = torch.Generator(device="cuda").manual_seed(len(case))
    b, h, n = {"long": (1, 40, 8200)}.get(case, (2, 3, 1000))
    chan = torch.exp(2 * torch.randn(128, device="cuda", generator=g))
    x = (torch.randn((b, h, n, 128), device="cuda", generator=g) + 3.0) * chan
    x[..., 9::50, :] = -0.0
    if case == "nonfinite":
        x[0, 0, 3, 5], x[0, 1, 40, 1], x[1, 2, 999, 0] = float("nan"), float("inf"), -float("inf")
    x = x.bfloat16()
    qm = q_block_mean_rows(x, 128)
    lp = -(-n // 128) * 128
    assert qk_pass(x, lp, hadamard=True, out_bf16=False, elem="e2m1", smoothed=True).kernel == "gluon"
    codes, scales = prepass_qk(x, "uos", hadamard=True, q_mean=(qm, 128))
    assert not builds.FAILURES  # the Gluon pass built (else the planner fell back to tl)
    per_row = q_block_means(x, 128)
    ref = mx_quantize(rotate(x.float() - per_row), axis=-1, rule="uos")
    assert torch.equal(codes[..., :n, :], ref.data) and torch.equal(scales[..., :n, :], ref.scales)
    assert (codes[..., n:, :] == 0).all() and (scales[..., n:, :] == 127).all()
    monkeypatch.setattr(prepass_hopper, "usable_q", lambda *a, **k: False)
    slow = prepass_qk(x, "uos", hadamard=True, q_mean=(qm, 128))
    assert torch.equal(codes, slow[0]) and torch.equal(scales, slow[1])


@triton.jit
def _e4m3_mismatches(Count, First, start, n, BLOCK: tl.constexpr):
    """Counts the fp32 bit patterns start .. start + n - 1 where the hardware and the generic E4M3
    roundings differ (NaN = NaN), and keeps the smallest such pattern."""
    offs = start + tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    bits = offs.to(tl.int32)
    r = bits.to(tl.float32, bitcast=True)
    hw, sw = e4m3_round_hw(r), e4m3_round(r)
    same = (hw.to(tl.int32, bitcast=True) == sw.to(tl.int32, bitcast=True)) | ((hw != hw) & (sw != sw))
    bad = (offs < start + n) & ~same
    tl.atomic_add(Count, tl.sum(bad.to(tl.int32)))
    tl.atomic_min(First, tl.min(tl.where(bad, bits, 0x7FFFFFFF)))


@triton.jit
def _e4m3_hw_values(X, Out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Out + offs, e4m3_round_hw(tl.load(X + offs, mask=offs < n)), mask=offs < n)


def test_hw_e4m3_cast_equals_generic():
    """The hardware fp32 -> E4M3 cast (`cast.e4m3_round_hw`: cvt.rn.satfinite.e4m3x2.f32 on sm_89+)
    is the generic `cast.e4m3_round` on every fp32 of [0, 2**105) (the scaled P~ values r the
    attention kernel rounds: ties to even, E4M3 subnormals, fp32 subnormals, saturation at 448 from
    464 on) and keeps NaN NaN; and `formats.rounding.round_magnitude` (the reference) on every fp32
    of [0, 2**9]. When it passes on a GPU family, add the family to `targets.HW_E4M3_CAST` (then
    test_pv8_hw_cast_same_p_decisions must pass there too)."""
    from mxattention.formats.ladders import E4M3
    from mxattention.formats.rounding import round_magnitude

    count = torch.zeros(1, dtype=torch.int32, device="cuda")
    first = torch.full((1,), 0x7FFFFFFF, dtype=torch.int32, device="cuda")
    block, end = 1024, 0x74000000  # 2**105: the generic rounding's domain
    _e4m3_mismatches[(-(-end // block),)](count, first, 0, end, BLOCK=block)
    assert count.item() == 0, f"{count.item()} patterns differ, first {first.item():#010x}"
    specials = torch.tensor(
        [0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0x7FA00000], dtype=torch.int32, device="cuda"
    )
    out = torch.empty(4, device="cuda")
    _e4m3_hw_values[(1,)](specials.view(torch.float32), out, 4, BLOCK=4)
    assert out.isnan().all()
    chunk = 1 << 26
    for start in range(0, 0x44000001, chunk):  # [0, 512] against the reference, in pieces
        bits = torch.arange(start, min(start + chunk, 0x44000001), dtype=torch.int32, device="cuda")
        r = bits.view(torch.float32)
        got = torch.empty_like(r)
        _e4m3_hw_values[(-(-r.numel() // block),)](r, got, r.numel(), BLOCK=block)
        want = round_magnitude(r, E4M3)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), f"chunk at {start:#010x}"


@pytest.mark.parametrize("path,layout", [("bf16", "bf16"), ("dot_scaled", "packed")])
def test_pv8_hw_cast_same_p_decisions(path, layout, monkeypatch):
    """mxattention-pv8 with the hardware E4M3 cast forced on (targets.HW_E4M3_CAST): O, lse and every
    Q(P~) the same as with the generic rounding, bit for bit, and within the reference bounds."""
    from mxattention.kernels import targets
    from mxattention.kernels.fused import fused_attention

    skip_unless_path_runs(path, "cuda")
    q, k, v = (t.cuda() for t in qkv(1, 4, 4, 1024, 1024, 128, seed=13))
    cfg = mx.get_method("mxattention-pv8")
    args = dict(scale=128**-0.5, matrix_path=path, kv_layout=layout, debug_p=True)
    monkeypatch.setattr(targets, "HW_E4M3_CAST", frozenset())
    generic = fused_attention(q, k, v, cfg, **args)
    family = targets.current_target(q.device).family
    monkeypatch.setattr(targets, "HW_E4M3_CAST", frozenset({family}))
    hw = fused_attention(q, k, v, cfg, **args)
    for a, b in zip(generic, hw, strict=True):
        assert torch.equal(a, b)
    c = compare(q.cpu(), k.cpu(), v.cpu(), cfg, device="cuda", matrix_path=path, kv_layout=layout)
    assert c.rel_l2 <= 1e-3 * c.quant_rel_l2 and c.p_differ <= 1e-3 * c.p_decisions
