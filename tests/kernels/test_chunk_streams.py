"""Head chunks on two streams (`plan.chunk_streams_for`, `fused.run_plan`; docs/design.md, 'Head
chunks on two streams'): the plan halves the one-stream chunks, so two chunks' operands alive at
once never take more than one did (CPU, planned on meta tensors at the benchmark's shapes); the
chunks give the bits of one launch (CPU interpreter, in order); on a GPU the two-stream run gives
the bits of the one-stream run with 2, 3 and odd chunk counts, GQA, B > 1, Q smoothing and the `tl`
kernel, with the caller's stream busy before and reading right after the call, and under CUDA
graph capture / replay."""

import dataclasses

import pytest
import torch

from mxattention.attention.config import get_method
from mxattention.kernels import attention_fwd_hopper as hopper
from mxattention.kernels import fused, plan, targets
from mxattention.kernels._triton import kernels_interpreted
from mxattention.kernels.prepass import padded_dim

from .helpers import qkv

ON_GPU = torch.cuda.is_available() and not kernels_interpreted()
gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (the streams overlap there)")

# (Hq, Hkv, Lq, Lk, D, B): the benchmark's shapes, GQA, batches, odd head counts.
SHAPES = [
    (40, 40, 16384, 16384, 128, 1),
    (24, 24, 32760, 32760, 128, 1),
    (40, 40, 75600, 75600, 128, 1),
    (40, 40, 75600, 512, 128, 1),
    (40, 8, 16384, 16384, 128, 2),
    (28, 7, 30000, 30000, 64, 3),
    (13, 13, 50000, 50000, 128, 1),
]


def _meta(b, hq, hk, lq, lk, d):
    q = torch.empty(b, hq, lq, d, dtype=torch.bfloat16, device="meta")
    k = torch.empty(b, hk, lk, d, dtype=torch.bfloat16, device="meta")
    return q, k, torch.empty_like(k)


def _cover(p):
    return [(bb, h) for c in p.chunks for bb in range(*c.batches) for h in range(*c.kv_heads)]


@pytest.mark.parametrize("method", ["mxattention", "mxattention-pv8-smooth"])
@pytest.mark.parametrize("bound", ["auto", 3 * 2**20, 40 * 2**20])
@pytest.mark.parametrize("shape", SHAPES)
def test_two_streams_keep_the_peak_of_one(shape, bound, method):
    """Two chunks alive on two streams hold at most the one-stream chunk's (batch, KV head) pairs,
    so at most its bytes (each chunk operand is proportional to them) and within the byte bound;
    the chunks cover every pair once."""
    hq, hk, lq, lk, d, b = shape
    q, k, v = _meta(b, hq, hk, lq, lk, d)
    args = dict(scale=0.1, matrix_path="bf16", kv_layout="bf16", kv_chunk_bytes=bound)
    one = plan.plan_call(get_method(method), q, k, v, chunk_streams=1, **args)
    two = plan.plan_call(get_method(method), q, k, v, chunk_streams=2, **args)
    every = [(bb, h) for bb in range(b) for h in range(hk)]
    assert one.chunk_streams == 1 and sorted(_cover(one)) == sorted(_cover(two)) == every
    assert two.live_kv_heads <= one.live_kv_heads
    lkp, dp = one.lk_pad, padded_dim(d)
    per_pair = 2 * lkp * 2 * dp  # bf16 K^ + V^ of one (batch, KV head)
    if one.kv_heads_per_chunk > 1:  # (one KV head of all batches is the least a chunk holds)
        assert two.live_kv_heads * per_pair <= plan.chunk_bytes(b, hk, lkp, dp, dp, bound)
    if len(one.chunks) >= 2 and one.kv_heads_per_chunk >= 2:
        assert two.chunk_streams == 2 and two.kv_heads_per_chunk <= one.kv_heads_per_chunk // 2
    else:
        assert two.chunk_streams == 1 and two.chunks == one.chunks


def test_benchmark_shapes_plan():
    """16k: 2 chunks of 20 heads (2560 CTAs, 19.4 waves of 132 SMs each) -> 4 of 10 on 2 streams;
    HunyuanVideo 2 x 12 -> 4 x 6; 75k 4 x 10 -> 8 x 5; the 512-key cross-attention stays one chunk
    on one stream (no chunk boundary to fill)."""
    for shape, one, two in [
        ((1, 40, 40, 16384, 16384, 128), (2, 20), (4, 10)),
        ((1, 24, 24, 32760, 32760, 128), (2, 12), (4, 6)),
        ((1, 40, 40, 75600, 75600, 128), (4, 10), (8, 5)),
        ((1, 40, 40, 75600, 512, 128), (1, 40), (1, 40)),
    ]:
        q, k, v = _meta(*shape)
        for streams, want in ((1, one), (2, two)):
            p = plan.plan_call(
                get_method("mxattention"), q, k, v, scale=0.1, matrix_path="bf16", kv_layout="bf16",
                chunk_streams=streams,
            )  # fmt: skip
            assert (len(p.chunks), p.kv_heads_per_chunk) == want, (shape, streams)
            assert p.chunk_streams == (2 if want[0] > one[0] else 1)


def test_recoverable_waves():
    """16k: 2 launches of 2560 CTAs on 132 SMs take 2 x 20 slots for 38.8 waves (39); HunyuanVideo
    2 x 3072: 48 for 47; Wan 75k 4 x 5910: 180 for 180; one launch: nothing."""
    assert plan.recoverable_waves([2560, 2560], 132) == pytest.approx(1 / 40)
    assert plan.recoverable_waves([3072, 3072], 132) == pytest.approx(1 / 48)
    assert plan.recoverable_waves([5910] * 4, 132) == 0.0
    assert plan.recoverable_waves([5120], 132) == 0.0
    assert plan.recoverable_waves([132, 132], 132) == 0.0 and plan.recoverable_waves([], 132) == 0.0


def test_default_is_two_streams_only_where_waves_are_recovered(monkeypatch):
    """None: 2 streams for CUDA calls on a `targets.CHUNK_STREAMS` family that the interpreter does
    not run, where the one-stream launches leave at least its share of wave slots to recover; CPU
    tensors, other families and the interpreter keep one; bad values raise."""
    least = targets.CHUNK_STREAMS["sm_90"]
    assert 0 < least < 1 / 48  # HunyuanVideo's 1 of 48 slots is taken, Wan 75k's 0 is not
    f = plan.chunk_streams_for
    assert f(None, targets.SM_90A, True, 2, 20, 1 / 40) == (1 if kernels_interpreted() else 2)
    assert f(None, targets.SM_90A, True, 2, 20, 0.0) == 1
    assert f(None, targets.SM_90A, False, 2, 20, 1 / 40) == 1
    assert f(None, targets.SM_100A, True, 2, 20, 1 / 40) == 1
    assert f(None, None, True, 2, 20, 1 / 40) == 1
    assert f(2, None, False, 2, 20) == 2  # asked: the chunks halve (run in order off CUDA)
    assert f(2, targets.SM_90A, True, 1, 40) == 1  # one chunk: no boundary to fill
    assert f(2, targets.SM_90A, True, 40, 1) == 1  # one head a chunk: nothing to halve
    assert f(1, targets.SM_90A, True, 2, 20, 1 / 40) == 1
    monkeypatch.setattr(plan, "kernels_interpreted", lambda: True)
    assert f(None, targets.SM_90A, True, 2, 20, 1 / 40) == 1
    monkeypatch.setattr(plan, "kernels_interpreted", lambda: False)
    assert f(None, targets.SM_90A, True, 2, 20, 1 / 40) == 2
    monkeypatch.setattr(targets, "CHUNK_STREAMS", {})
    assert f(None, targets.SM_90A, True, 2, 20, 1 / 40) == 1
    for bad in (0, 3, True, "2"):
        with pytest.raises(ValueError, match="chunk_streams"):
            f(bad, targets.SM_90A, True, 2, 20)
    q, k, v = _meta(1, 40, 40, 16384, 16384, 128)
    p = plan.plan_call(get_method("mxattention"), q, k, v, scale=0.1, matrix_path="bf16", kv_layout="bf16")
    assert p.chunk_streams == 1 and len(p.chunks) == 2  # meta tensors are not CUDA


@pytest.mark.skipif(not hopper.HAS_GLUON, reason="this Triton has no Gluon")
def test_default_on_an_h200(monkeypatch):
    """Planned as on an H200 (132 SMs, 141 GiB, sm_90, the Gluon forward): 1/64 of its memory holds
    every benchmark shape's K^ + V^ in one chunk (one stream); Q smoothing's correction, 4 bytes per
    query block and key, takes 4 chunks at Wan 75k. With a 16 GiB card (1/64: the 256 MiB floor), the bounds
    of before: 16k and HunyuanVideo take two streams, Wan 75k (nothing to recover, 1.1 % slower
    measured) and the one-chunk cross-attention one."""
    from types import SimpleNamespace

    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda d: SimpleNamespace(multi_processor_count=132)
    )
    monkeypatch.setattr(plan, "current_target", lambda device: targets.SM_90A)
    monkeypatch.setattr(plan, "kernels_interpreted", lambda: False)
    h200 = [
        ((1, 40, 40, 16384, 16384, 128), {"mxattention": (1, 1), "mxattention-pv8-smooth": (1, 1)}),
        ((1, 24, 24, 32760, 32760, 128), {"mxattention": (1, 1), "mxattention-pv8-smooth": (1, 1)}),
        ((1, 40, 40, 75600, 75600, 128), {"mxattention": (1, 1), "mxattention-pv8-smooth": (4, 1)}),
        ((1, 40, 40, 75600, 512, 128), {"mxattention": (1, 1), "mxattention-pv8-smooth": (1, 1)}),
    ]
    small = [
        ((1, 40, 40, 16384, 16384, 128), {"mxattention": (4, 2), "mxattention-pv8-smooth": (4, 2)}),
        ((1, 24, 24, 32760, 32760, 128), {"mxattention": (4, 2), "mxattention-pv8-smooth": (6, 2)}),
        ((1, 40, 40, 75600, 75600, 128), {"mxattention": (4, 1), "mxattention-pv8-smooth": (20, 1)}),
    ]
    cases = [(150_000_000_000, shape, want) for shape, want in h200]
    cases += [(16 * 2**30, shape, want) for shape, want in small]
    for memory, shape, want in cases:
        monkeypatch.setattr(plan, "device_memory", lambda device, memory=memory: memory)
        q, k, v = _meta(*shape)
        for method, (chunks, streams) in want.items():
            p = plan.plan_call(get_method(method), q, k, v, scale=0.1)
            assert p.fwd_kernel == "gluon" and (len(p.chunks), p.chunk_streams) == (chunks, streams), (
                memory,
                shape,
                method,
            )


def test_describe_prints_the_streams():
    q, k, v = _meta(1, 40, 40, 16384, 16384, 128)
    args = dict(scale=0.1, matrix_path="bf16", kv_layout="bf16")
    two = plan.plan_call(get_method("mxattention"), q, k, v, chunk_streams=2, **args)
    assert (
        "chunks: 4 of <= 3276 batches x 10 KV heads, alternately on 2 streams (20 batch x KV heads alive)"
        in (two.describe())
    )
    one = plan.plan_call(get_method("mxattention"), q, k, v, chunk_streams=1, **args)
    assert "x 20 KV heads, in order (20 batch x KV heads alive)" in one.describe()


@pytest.mark.skipif(ON_GPU, reason="on a GPU the tests below run the chunks on two streams")
def test_halved_chunks_change_nothing(device):
    """The two-stream plan's chunks (in order on the CPU, overlapped on a GPU) give the bits of
    the one-stream plan's: GQA, 2 batches, 3 KV heads in 3 chunks, the `tl` kernel with Q(P~)."""
    q, k, v = (t.to(device) for t in qkv(2, 6, 3, 70, 100, 64, seed=31))
    cfg = get_method("mxattention")
    per_pair = 2 * 2 * 128 * (64 + 64)  # bf16 K^ + V^ of one KV head, both batches
    args = dict(scale=0.125, matrix_path="bf16", kv_layout="bf16", debug_p=True, kv_chunk_bytes=2 * per_pair)
    one = fused.fused_attention(q, k, v, cfg, chunk_streams=1, **args)
    p = plan.plan_call(cfg, q, k, v, chunk_streams=2, **args)
    assert [c.kv_heads for c in p.chunks] == [(0, 1), (1, 2), (2, 3)] and p.chunk_streams == 2
    two = fused.run_plan(p, q, k, v)
    for a, b in zip(one, two, strict=True):
        assert torch.equal(a, b)


# ---- GPU: the streams for real ----------------------------------------------------------------


def _bits(x):
    return x.view(torch.int16) if x.element_size() == 2 else x.view(torch.int32)


def _same(a, b):
    return all(torch.equal(_bits(x), _bits(y)) for x, y in zip(a, b, strict=True) if x is not None)


def _gpu_qkv(b, hq, hk, l, d, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    chan = torch.exp(torch.randn(d, device="cuda", generator=g))
    q = (torch.randn(b, hq, l, d, device="cuda", generator=g) * chan).bfloat16()
    k = (torch.randn(b, hk, l, d, device="cuda", generator=g) * chan).bfloat16()
    v = torch.randn(b, hk, l, d, device="cuda", generator=g).bfloat16()
    return q, k, v


def _busy_then(fresh, into):
    """Keep the caller's stream busy (~20 ms), then copy `fresh` into `into` on it: a side stream
    that does not wait for the caller reads the stale values."""
    torch.cuda._sleep(40_000_000)
    for a, b in zip(into, fresh, strict=True):
        a.copy_(b)


@gpu_only
@pytest.mark.parametrize(
    "method,b,hq,hk,l,pairs,chunks",
    [
        ("mxattention", 1, 4, 4, 2048, 2, 2),  # one-stream plan of 2 chunks, run on 2 streams
        ("mxattention", 1, 3, 3, 2048, 2, 3),
        ("mxattention", 1, 5, 5, 2048, 4, 5),  # odd
        ("mxattention", 2, 8, 4, 1024, 2, 4),  # GQA, B > 1
        ("mxattention-pv8-smooth", 1, 6, 6, 2048, 4, 6),  # the correction chunked too
        ("mxattention-pv8-smooth", 2, 6, 3, 1024, 2, 3),
    ],
)
def test_two_streams_bit_identical(method, b, hq, hk, l, pairs, chunks):
    """Two streams == one stream, bit for bit (O and lse), with the caller's stream still writing
    the inputs when the call is issued and reading O / lse right after it returns."""
    cfg = get_method(method)
    q, k, v = _gpu_qkv(b, hq, hk, l, 128, seed=hq + 7 * b)
    per_pair = 2 * b * l * 256  # bf16 K^ + V^ of one KV head, all batches
    args = dict(scale=128**-0.5, kv_chunk_bytes=pairs * per_pair)
    one = fused.fused_attention(q, k, v, cfg, chunk_streams=1, **args)
    p = plan.plan_call(cfg, q, k, v, chunk_streams=2, **args)
    if chunks == 2:  # the auto policy halves 2 chunks into 4: make 2 the hard way
        p = dataclasses.replace(plan.plan_call(cfg, q, k, v, chunk_streams=1, **args), chunk_streams=2)
    assert p.chunk_streams == 2 and len(p.chunks) == chunks, p.describe()
    assert p.fwd_kernel == "gluon"
    qs, ks, vs = (torch.zeros_like(t) for t in (q, k, v))
    _busy_then((q, k, v), (qs, ks, vs))
    two = fused.run_plan(p, qs, ks, vs)
    got = (two.out.clone(), two.lse.clone())  # on the caller's stream, right away
    assert _same(got, one[:2]), p.describe()


@gpu_only
def test_two_streams_join_before_return():
    """The caller's stream waits for the side stream: one KV head on the caller's stream, 15 on the
    side (15x the work there), O / lse read on the caller's stream right after the call."""
    cfg = get_method("mxattention")
    q, k, v = _gpu_qkv(1, 16, 16, 4096, 128, seed=21)
    one = fused.fused_attention(q, k, v, cfg, scale=128**-0.5, chunk_streams=1)
    p = plan.plan_call(cfg, q, k, v, scale=128**-0.5, chunk_streams=1, kv_chunk_bytes=2 * 4096 * 256)
    c0, c1 = p.chunks[0], p.chunks[1]
    p = dataclasses.replace(p, chunks=(c0, dataclasses.replace(c1, kv_heads=(1, 16))), chunk_streams=2)
    for _ in range(3):
        two = fused.run_plan(p, q, k, v)
        got = (two.out.clone(), two.lse.clone())
        assert _same(got, one[:2])


@gpu_only
def test_two_streams_tl_kernel_causal():
    """The `tl` kernel (causal: not the Gluon forward's) on two streams, 4 chunks, Q(P~) too."""
    cfg = get_method("mxattention")
    q, k, v = _gpu_qkv(1, 8, 8, 1024, 128, seed=3)
    args = dict(scale=128**-0.5, is_causal=True, debug_p=True, kv_chunk_bytes=4 * 2 * 1024 * 256)
    one = fused.fused_attention(q, k, v, cfg, chunk_streams=1, **args)
    p = plan.plan_call(cfg, q, k, v, chunk_streams=2, **args)
    assert p.chunk_streams == 2 and len(p.chunks) == 4 and p.fwd_kernel == "tl"
    assert _same(fused.run_plan(p, q, k, v, is_causal=True), one)


@gpu_only
def test_two_streams_peak_memory_not_above_one():
    """torch's allocator counts two half chunks alive at once: no more than one whole chunk."""
    cfg = get_method("mxattention")
    q, k, v = _gpu_qkv(1, 8, 8, 4096, 128, seed=5)
    args = dict(scale=128**-0.5, kv_chunk_bytes=4 * 2 * 4096 * 256)
    peaks = {}
    for streams in (1, 2, 1, 2):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        r = fused.fused_attention(q, k, v, cfg, chunk_streams=streams, **args)
        torch.cuda.synchronize()
        peaks[streams] = torch.cuda.max_memory_allocated() - base
        del r
    assert peaks[2] <= peaks[1], peaks


@gpu_only
def test_two_streams_under_cuda_graph_capture():
    """Captured with its side stream (fork / join inside the graph, chunk buffers from the graph's
    pool) and replayed on new inputs: the bits of the eager one-stream call."""
    cfg = get_method("mxattention-pv8-smooth")
    q, k, v = _gpu_qkv(1, 6, 6, 2048, 128, seed=11)
    args = dict(scale=128**-0.5, kv_chunk_bytes=4 * 2 * 2048 * 256)
    p = plan.plan_call(cfg, q, k, v, chunk_streams=2, **args)
    assert p.chunk_streams == 2 and len(p.chunks) == 6
    sq, sk, sv = (torch.zeros_like(t) for t in (q, k, v))
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):  # compile and fill the pools outside the capture, as torch asks
        fused.run_plan(p, sq, sk, sv)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        res = fused.run_plan(p, sq, sk, sv)
    for seed in (12, 13):
        q, k, v = _gpu_qkv(1, 6, 6, 2048, 128, seed=seed)
        for a, b in zip((sq, sk, sv), (q, k, v), strict=True):
            a.copy_(b)
        graph.replay()
        want = fused.fused_attention(q, k, v, cfg, chunk_streams=1, **args)
        assert _same(res[:2], want[:2])
