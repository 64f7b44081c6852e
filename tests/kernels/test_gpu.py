"""GPU-only checks (skipped without CUDA): large shapes vs the reference, compile, CUDA graphs."""

import warnings

import pytest
import torch

import mxattention as mx
from mxattention.kernels import op

from .helpers import compare, qkv

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
    fast = prepass_qk(x, rule, hadamard=True, out_bf16=True)
    assert not prepass_hopper._broken
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
    assert not prepass_hopper._broken
    ref = mx_quantize(rotate(x.float()), axis=-1, rule=rule)
    assert torch.equal(codes[..., :n, :], ref.data) and torch.equal(scales[..., :n, :], ref.scales)
    assert (codes[..., n:, :] == 0).all() and (scales[..., n:, :] == 127).all()
    monkeypatch.setattr(prepass_hopper, "usable_q", lambda *a, **k: False)
    slow = prepass_qk(x, rule, hadamard=True)
    assert torch.equal(codes, slow[0]) and torch.equal(scales, slow[1])
