"""The varlen kernels (`kernels.fused_varlen`) = one dense kernel call per sequence, bit for bit.

Each sequence's tiles and V^ blocks start at its own first token and its last tile loads zeros
past its end, so O and lse must equal `fused_attention` on that sequence's rows exactly (same
block_m, path and layout). Against the reference the bounds of test_attention_kernel.py hold.
On the CPU these run in Triton's interpreter (small shapes: each call takes seconds).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mxattention as mx
from mxattention.attention.config import get_method
from mxattention.attention.varlen import spans, varlen_reference
from mxattention.kernels import attention_fwd, fused_varlen, prepass
from mxattention.kernels.fused import fused_attention
from mxattention.kernels.fused_varlen import fused_varlen_attention, per_sequence_attention
from mxattention.ops import call as varlen_op

# The one-launch kernel equals one dense call per sequence on the H200 too (2026-12-01: these tests
# passed there, and the gpubugs diagnostics); its wrong O there had been the dense kernel's (V's
# padded head dim 32 under Q's, `targets.NARROW_V_BROKEN`) and its illegal memory access Triton's
# dot_scaled emulation (refused, `plan.dot_scaled_refusal`). MXATTENTION_VARLEN_KERNEL=0 (dense calls
# per sequence) skips them on a GPU.
OPTED_OUT_ON_GPU = pytest.mark.skipif(
    torch.cuda.is_available() and not fused_varlen.varlen_kernel_enabled(),
    reason="MXATTENTION_VARLEN_KERNEL=0: the one-launch varlen kernel does not run on this GPU",
)


def packed(lens_q, lens_k, hq=2, hk=1, d=32, dv=None, *, seed=0, nan_seq=None):
    """Packed q, k, v with channel outliers and a V spike at each sequence's first key; with
    `nan_seq`, a NaN in that sequence's V (it must stay in that sequence)."""
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(lens_q), sum(lens_k)
    q = torch.randn(tq, hq, d, generator=g) * torch.exp(torch.randn(d, generator=g))
    k = torch.randn(tk, hk, d, generator=g) + 2.0 * torch.randn(d, generator=g)
    v = torch.randn(tk, hk, dv or d, generator=g)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    firsts = cu_k[:-1][torch.tensor(lens_k) > 0].long()
    v[firsts] *= 50.0
    if nan_seq is not None:
        v[int(cu_k[nan_seq]) + 1, 0, 3] = float("nan")
    return q, k, v, cu_q, cu_k


class LargestAllocation(TorchDispatchMode):
    """The most elements of one tensor that torch allocates (the interpreter's storage copies aside)."""

    ALLOCS = ("aten.empty.", "aten.empty_strided.", "aten.zeros.", "aten.full.", "aten.new_empty.")

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if str(func).startswith(self.ALLOCS):
            self.largest = max(self.largest, out.numel())
        return out


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(torch.nan_to_num(a, nan=7.0), torch.nan_to_num(b, nan=7.0)) and torch.equal(
        a.isnan(), b.isnan()
    )


def check_per_sequence(q, k, v, cu_q, cu_k, out, lse, method, device, **kw):
    """O / lse of the varlen call against one `fused_attention` call per sequence, bit for bit."""
    cfg = get_method(method)
    scale = kw.pop("scale", q.shape[-1] ** -0.5)
    for q0, q1, k0, k1 in spans(cu_q.tolist(), cu_k.tolist()):
        if q1 == q0:
            continue
        if k1 == k0:
            assert (out[q0:q1] == 0).all() and torch.isneginf(lse[:, q0:q1]).all()
            continue
        views = (
            x[a:b].permute(1, 0, 2)[None].to(device) for x, a, b in ((q, q0, q1), (k, k0, k1), (v, k0, k1))
        )
        o, l = (x.cpu() for x in fused_attention(*views, cfg, scale=scale, **kw)[:2])
        assert same(out[q0:q1], o[0].permute(1, 0, 2)), f"O of rows {q0}:{q1}"
        assert same(lse[:, q0:q1], l[0]), f"lse of rows {q0}:{q1}"


def run(q, k, v, cu_q, cu_k, method, device, **kw):
    cfg = get_method(method)
    lq, lk = cu_q.diff().max().item(), cu_k.diff().max().item()
    dev = [x.to(device) for x in (q, k, v, cu_q, cu_k)]
    out, lse = fused_varlen_attention(*dev, lq, lk, cfg, scale=q.shape[-1] ** -0.5, **kw)
    return out.cpu(), lse.cpu()


@OPTED_OUT_ON_GPU
@pytest.mark.parametrize("method", ["mxattention", "mxattention-pv8", "mxfp8"])
def test_mixed_lengths_dot_scaled(method, device):
    # Empty query and key sequences, lengths off multiples of 32 and of the tiles, GQA. A NaN in
    # sequence 1's V lies inside sequence 0's last key tile: it must reach sequence 1's rows only.
    # mxattention-pv8: V^ as E4M3 bytes (one per key) in the varlen layout.
    q, k, v, cu_q, cu_k = packed([5, 4, 0, 3, 70], [37, 13, 64, 0, 130], hq=2, hk=1, nan_seq=1)
    out, lse = run(q, k, v, cu_q, cu_k, method, device, block_m=64)
    nan = torch.zeros_like(out, dtype=torch.bool)
    nan[5:9, :, 3] = True  # the NaN's V^ block (channel 3; both query heads read the KV head)
    assert torch.equal(out.isnan(), nan)
    assert out[9:12].eq(0).all() and torch.isneginf(lse[:, 9:12]).all()  # queries without keys
    check_per_sequence(q, k, v, cu_q, cu_k, out, lse, method, device, block_m=64)


@OPTED_OUT_ON_GPU
@pytest.mark.parametrize("method", ["mxfp4-ocp", "mxattention-pv8"])
def test_causal_bf16_layout(method, device):
    # Top-left causal per sequence with Lq < Lk and Lq > Lk; the Hopper path's bf16 K^ / V^ layout
    # (Dv > D: sm_90 refuses it for Dv < D), with a NaN in sequence 1's V inside sequence 0's last
    # key tile.
    q, k, v, cu_q, cu_k = packed([10, 70, 5], [20, 33, 9], hq=2, hk=2, d=32, dv=64, seed=1, nan_seq=1)
    kw = dict(is_causal=True, matrix_path="bf16", kv_layout="bf16", block_m=64)
    out, lse = run(q, k, v, cu_q, cu_k, method, device, **kw)
    nan = torch.zeros_like(out, dtype=torch.bool)
    nan[10:80, 0, 3] = True  # the NaN's V^ block (channel 3, head 0) in sequence 1's rows only
    assert torch.equal(out.isnan(), nan)
    check_per_sequence(q, k, v, cu_q, cu_k, out, lse, method, device, **kw)


@OPTED_OUT_ON_GPU
def test_many_short_sequences_in_launch_pieces(device, monkeypatch):
    # 9 sequences, in launches of 2 sequences each (CUDA's grid-z limit lowered): 5 V^ launches and
    # 5 attention launches, the same bytes; no tensor of the padded [B, max_len] layout.
    monkeypatch.setattr(attention_fwd, "GRID_Z_MAX", 2)
    monkeypatch.setattr(prepass, "GRID_Z_MAX", 2)
    launches = []
    original = attention_fwd._launch
    monkeypatch.setattr(
        attention_fwd, "_launch", lambda call, *a: launches.append(call.grid) or original(call, *a)
    )
    lens_q, lens_k = [1, 2, 3, 1, 4, 2, 100, 3, 1], [2, 1, 5, 1, 3, 33, 90, 1, 2]
    q, k, v, cu_q, cu_k = packed(lens_q, lens_k, hq=1, hk=1, seed=2)
    with LargestAllocation() as probe:
        out, lse = run(q, k, v, cu_q, cu_k, "mxattention", device, matrix_path="bf16")
    assert [g[2] for g in launches] == [2, 2, 2, 2, 1]
    # The largest is V^ in the varlen layout (total + 32 per sequence rows); a padded batch: 9 x 100.
    assert probe.largest == prepass.varlen_v_len(sum(lens_k), 9) * 32 < 9 * 100 * 32
    check_per_sequence(q, k, v, cu_q, cu_k, out, lse, "mxattention", device, matrix_path="bf16")


def test_public_entry_runs_the_kernels(device, monkeypatch):
    # The public function routes to the kernels (no reference warning) and agrees with the
    # reference within test_attention_kernel.py's bounds; one sequence = a dense call.
    monkeypatch.setenv("MXATTENTION_CPU_KERNELS", "1")
    q, k, v, cu_q, cu_k = packed([150], [129], hq=2, hk=2, seed=3)
    dev = [x.to(device) for x in (q, k, v, cu_q, cu_k)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, lse = mx.varlen_attention(*dev, return_lse=True)
    out, lse = out.cpu(), lse.cpu()
    check_per_sequence(q, k, v, cu_q, cu_k, out, lse, "mxattention", device)
    cfg = get_method("mxattention")
    ref_o, ref_l = varlen_reference(q, k, v, cu_q.tolist(), cu_k.tolist(), cfg, scale=32**-0.5)
    fp_o, _ = varlen_reference(q, k, v, cu_q.tolist(), cu_k.tolist(), get_method("fp"), scale=32**-0.5)
    quant = (ref_o - fp_o).norm() / fp_o.norm()
    assert (out - ref_o).norm() / ref_o.norm() <= 1e-3 * quant
    assert (lse - ref_l).abs().max() <= 1e-4 + 0.6


@OPTED_OUT_ON_GPU
@pytest.mark.parametrize("scale", [-0.3, 0.0])
def test_scale_not_positive_as_dense(device, scale):
    q, k, v, cu_q, cu_k = packed([33, 7], [40, 9], seed=4)
    cfg = get_method("mxattention")
    dev = [x.to(device) for x in (q, k, v, cu_q, cu_k)]
    out, lse = fused_varlen_attention(*dev, 33, 40, cfg, scale=scale)
    check_per_sequence(q, k, v, cu_q, cu_k, out.cpu(), lse.cpu(), "mxattention", device, scale=scale)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("is_causal", [False, True])
def test_gpu_d128_bf16_equals_dense_per_sequence(is_causal):
    # The shapes of real use on the GPU: bf16, head dim 128 (on sm_90 the Gluon Q^ / K^ passes and the
    # bf16 K^ / V^ layout; on sm_100 dot_scaled), GQA, long and short sequences, one empty.
    lens_q, lens_k = [1000, 3, 0, 4100, 517], [1000, 77, 40, 4100, 2048]
    q, k, v, cu_q, cu_k = packed(lens_q, lens_k, hq=8, hk=2, d=128, seed=5)
    q, k, v = (x.cuda().bfloat16() for x in (q, k, v))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, lse = mx.varlen_attention(
            q, k, v, cu_q.cuda(), cu_k.cuda(), is_causal=is_causal, return_lse=True
        )
    for q0, q1, k0, k1 in spans(cu_q.tolist(), cu_k.tolist()):
        if q1 > q0:
            views = (x[a:b].permute(1, 0, 2)[None] for x, a, b in ((q, q0, q1), (k, k0, k1), (v, k0, k1)))
            o, l = mx.scaled_dot_product_attention(
                *views, is_causal=is_causal, enable_gqa=True, return_lse=True
            )
            assert torch.equal(out[q0:q1], o[0].permute(1, 0, 2)) and torch.equal(lse[:, q0:q1], l[0])
    assert torch.isfinite(out).all()


def test_per_sequence_path_equals_the_varlen_kernel(device):
    # What GPUs run (dense calls per sequence on views) = the one-launch kernel, bit for bit.
    q, k, v, cu_q, cu_k = packed([5, 0, 40], [37, 9, 70], hq=2, hk=1, seed=6)
    cfg = get_method("mxattention")
    dev = [x.to(device) for x in (q, k, v, cu_q, cu_k)]
    a = per_sequence_attention(*dev[:3], cu_q.tolist(), cu_k.tolist(), cfg, scale=0.2)
    if device == "cuda" and not fused_varlen.varlen_kernel_enabled():
        pytest.skip("MXATTENTION_VARLEN_KERNEL=0: the one-launch kernel does not run on this GPU")
    b = fused_varlen_attention(*dev, 40, 70, cfg, scale=0.2)
    assert same(a[0], b[0]) and same(a[1], b[1])


def test_opt_out_takes_the_per_sequence_path(monkeypatch):
    # Outside the interpreter the op runs the one-launch kernel unless MXATTENTION_VARLEN_KERNEL=0,
    # and then per_sequence_attention. CPU tensors through the kernels: the interpreter only.
    if torch.cuda.is_available():
        pytest.skip("CPU tensors reach the kernels only on the interpreter")
    calls = []
    monkeypatch.setenv("MXATTENTION_CPU_KERNELS", "1")
    monkeypatch.setattr(fused_varlen, "kernels_interpreted", lambda: False)
    monkeypatch.setattr(
        varlen_op,
        "per_sequence_attention",
        lambda *a, **kw: (
            calls.append(1)
            or (
                torch.zeros(a[0].shape[0], a[0].shape[1], a[2].shape[2]),
                torch.zeros(a[0].shape[1], a[0].shape[0]),
            )
        ),
    )
    monkeypatch.setattr(varlen_op, "fused_varlen_attention", lambda *a, **kw: pytest.fail("kernel ran"))
    q, k, v, cu_q, cu_k = packed([5, 7], [9, 3], seed=7)
    cfg_key = "mxattention"
    monkeypatch.setenv(fused_varlen.VARLEN_KERNEL_ENV, "0")
    varlen_op.varlen_op(q, k, v, cu_q, cu_k, -1, -1, False, 0.2, cfg_key)
    assert calls == [1]
    monkeypatch.delenv(fused_varlen.VARLEN_KERNEL_ENV)
    with pytest.raises(pytest.fail.Exception, match="kernel ran"):
        varlen_op.varlen_op(q, k, v, cu_q, cu_k, -1, -1, False, 0.2, cfg_key)


@pytest.mark.parametrize("kernels", [True, False])
def test_q_smoothing_equals_dense_calls_per_sequence(device, monkeypatch, kernels):
    # Q smoothing (mxattention-pv8-smooth): each sequence's O and lse are those of the public dense
    # call of its rows, bit for bit, where the kernels run (one dense kernel call per sequence: the
    # one-launch kernel does not smooth Q) and where the reference does. Sequence 0 spans two
    # smoothing blocks of 128 queries, sequence 1 a short one (causal: top-left per sequence).
    if kernels:
        monkeypatch.setenv("MXATTENTION_CPU_KERNELS", "1")
    elif device == "cuda":
        pytest.skip("CUDA tensors take the kernels")
    q, k, v, cu_q, cu_k = packed([130, 3], [100, 20], hq=1, hk=1, seed=8)
    dev = [x.to(device) for x in (q, k, v, cu_q, cu_k)]
    method = "mxattention-pv8-smooth"
    with warnings.catch_warnings():
        warnings.simplefilter("error" if kernels else "ignore")
        out, lse = mx.varlen_attention(*dev, method=method, is_causal=True, return_lse=True)
        for q0, q1, k0, k1 in spans(cu_q.tolist(), cu_k.tolist()):
            views = (x[a:b].permute(1, 0, 2)[None] for x, a, b in ((q, q0, q1), (k, k0, k1), (v, k0, k1)))
            o, l = mx.scaled_dot_product_attention(
                *(x.to(device) for x in views),
                method=method,
                is_causal=True,
                enable_gqa=True,
                return_lse=True,
            )
            assert same(out[q0:q1].cpu(), o[0].permute(1, 0, 2).cpu()), f"O of rows {q0}:{q1}"
            assert same(lse[:, q0:q1].cpu(), l[0].cpu()), f"lse of rows {q0}:{q1}"
    if kernels:  # the kernels' own entry takes the same per-sequence path (on sequence 1 alone)
        cu = [torch.tensor([0, n], dtype=torch.int32, device=device) for n in (3, 20)]
        one = (q[130:].to(device), k[100:].to(device), v[100:].to(device), *cu)
        direct = fused_varlen_attention(*one, 3, 20, get_method(method), is_causal=True, scale=32**-0.5)
        assert same(direct[0].cpu(), out[130:].cpu()) and same(direct[1].cpu(), lse[:, 130:].cpu())
