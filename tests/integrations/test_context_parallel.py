"""Context parallelism: the forward op's (out, lse) merge over key chunks, and diffusers' ring /
Ulysses attention with the mxattention backend on a 2-process gloo group."""

import tempfile

import pytest
import torch

pytest.importorskip("diffusers")

from mxattention import InferenceOnlyError, merge_attention
from mxattention.integrations import register_preset_backends
from mxattention.integrations.diffusers_backend import mxattention_backward_op, mxattention_forward_op
from tests.integrations import tiny_models
from tests.integrations.tiny_models import rel_l2

B, SQ, SK, H, D = 2, 96, 256, 2, 64


def _qkv(seed=0, outliers=True):
    """[B, S, H, D] (diffusers' layout); a few large Q/K channels make the softmax peaky."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(B, SQ, H, D, generator=g),
        torch.randn(B, SK, H, D, generator=g),
        torch.randn(B, SK, H, D, generator=g),
    )
    if outliers:
        q[..., :4] *= 6.0
        k[..., :4] *= 6.0
    return q, k, v


def _split_merge(method, q, k, v, chunks=2, ring_formula=False, native=False):
    pieces = [
        mxattention_forward_op(None, q, kc, vc, return_lse=True, method=method, native=native)
        for kc, vc in zip(k.chunk(chunks, dim=1), v.chunk(chunks, dim=1), strict=True)
    ]
    if ring_formula:  # diffusers' TemplatedRingAttention update, verbatim
        out, lse = pieces[0][0].float(), pieces[0][1].unsqueeze(-1)
        for o, s in pieces[1:]:
            s = s.unsqueeze(-1)
            out = out - torch.sigmoid(s - lse) * (out - o)
            lse = lse - torch.nn.functional.logsigmoid(lse - s)
        return out, lse.squeeze(-1)
    # merge_attention works on [..., L, Dv] / [..., L]: move heads before the sequence.
    out, lse = merge_attention([o.transpose(1, 2) for o, _ in pieces], [s.transpose(1, 2) for _, s in pieces])
    return out.transpose(1, 2), lse.transpose(1, 2)


def test_forward_op_layout_and_lse():
    q, k, v = _qkv()
    out, lse = mxattention_forward_op(None, q, k, v, return_lse=True, method="fp")
    assert out.shape == (B, SQ, H, D) and lse.shape == (B, SQ, H) and lse.dtype == torch.float32
    scores = torch.einsum("bqhd,bkhd->bqhk", q, k) / D**0.5
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1), atol=1e-4, rtol=1e-6)
    assert torch.equal(mxattention_forward_op(None, q, k, v, method="fp"), out)
    with pytest.raises(InferenceOnlyError, match="inference-only"):
        mxattention_backward_op(None, out)


@pytest.mark.parametrize("ring_formula", [False, True])
def test_fp_split_keys_merge_to_the_single_call(ring_formula):
    q, k, v = _qkv()
    ref_out, ref_lse = mxattention_forward_op(None, q, k, v, return_lse=True, method="fp")
    for chunks in (2, 4):
        out, lse = _split_merge("fp", q, k, v, chunks, ring_formula)
        assert rel_l2(out, ref_out) <= 1e-5
        torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("method", ["mxattention", "mxfp4-ocp-hadamard-pnq"])
def test_pnq_rows_sum_to_one_after_merging(method):
    q, k, _ = _qkv()
    ones = torch.ones(B, SK, H, D)
    for chunks in (1, 2):
        out, _ = _split_merge(method, q, k, ones, chunks)
        assert (out - 1).abs().max() <= 1e-6, (method, chunks)
    # Without PNQ the row sum adds the unquantized P~, so the weights do not sum to one.
    out, _ = _split_merge("mxfp4-ocp", q, k, ones, 2)
    assert (out - 1).abs().max() > 1e-3


def test_quantized_split_differs_boundedly_from_the_single_call():
    # P~ is quantized against the running max of the keys seen, so the split changes the result.
    q, k, v = _qkv()
    ref = mxattention_forward_op(None, q, k, v, method="mxattention")
    fp = mxattention_forward_op(None, q, k, v, method="fp")
    out, _ = _split_merge("mxattention", q, k, v, 2)
    error = rel_l2(ref, fp)  # 4-bit attention on peaky rows: ~0.23 here
    assert rel_l2(out, ref) < 0.25 * error  # the split moves the result far less than quantizing does
    assert rel_l2(out, fp) < 1.1 * error  # and leaves it as accurate


def test_masks_and_native_in_the_forward_op():
    q, k, v = _qkv()
    key_mask = torch.arange(SK).expand(B, SK) % 3 != 0  # diffusers' 2-D [B, Sk]
    out = mxattention_forward_op(None, q, k, v, key_mask, method="fp")
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(x.transpose(1, 2) for x in (q, k, v)), attn_mask=key_mask[:, None, None, :]
    ).transpose(1, 2)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)
    native = mxattention_forward_op(None, q, k, v, key_mask, native=True)
    assert torch.equal(native, ref)
    # With the lse asked for (ring), "native" runs torch's flash op, the kernel CPU SDPA runs.
    native_out, native_lse = mxattention_forward_op(None, q, k, v, key_mask, return_lse=True, native=True)
    _, fp_lse = mxattention_forward_op(None, q, k, v, key_mask, return_lse=True, method="fp")
    assert torch.equal(native_out, ref)
    torch.testing.assert_close(native_lse, fp_lse, atol=1e-5, rtol=1e-6)
    with pytest.raises(ValueError, match="does not rotate the mask"):
        mxattention_forward_op(None, q, k[:, : SK // 2], v[:, : SK // 2], key_mask, return_lse=True)


def _spawn_cp(device_type, dtype_name):
    import torch.multiprocessing as mp

    from tests.integrations import _cp_worker

    # On the CPU the ranks are forked: they start with this process's torch, diffusers and mxattention
    # already imported (spawned, each paid ~10 s of CPU importing them again). CUDA needs spawn.
    method = "fork" if device_type == "cpu" else "spawn"
    with tempfile.TemporaryDirectory() as path:
        args = (2, path, device_type, dtype_name)
        mp.start_processes(_cp_worker.run, args=args, nprocs=2, join=True, start_method=method)
        return torch.load(f"{path}/rank0.pt")


def _one_process(device, dtype):
    from diffusers.models.attention_dispatch import attention_backend

    register_preset_backends()
    model = tiny_models.wan().to(device, dtype)
    inputs = tiny_models.to(tiny_models.wan_inputs(), device, dtype)
    with torch.no_grad():
        out = {"native": model(**inputs)[0].float().cpu()}
        for backend in ("mxattention_fp", "mxattention"):
            with attention_backend(backend):
                out[backend] = model(**inputs)[0].float().cpu()
    return out


def _check_cp(got, ref, tol):
    assert rel_l2(got["ring_fp"], ref["mxattention_fp"]) <= tol
    assert rel_l2(got["ulysses_mx"], ref["mxattention"]) <= tol  # whole heads per rank: split-free
    assert rel_l2(got["ring_mx"], ref["mxattention"]) < 0.5 * rel_l2(ref["mxattention"], ref["native"])
    for label in ("ring_keep_all", "ulysses_keep_all"):
        assert rel_l2(got[label], ref["native"]) <= tol, label
        counts = got[label + "_counts"]
        assert counts["quantized"] == 0 and counts["high_precision"] == 4, label
    # Compiled: the ring's per-call decision at run time; eager and compiled runs counted alike.
    assert torch.equal(got["ring_policy_compiled"], got["ring_policy_eager"])
    stats = got["ring_policy_stats"]
    assert stats["routed"] == stats["high_precision"] == 4 and stats["fallback"] == 0


@pytest.mark.distributed
def test_diffusers_ring_and_ulysses_on_two_gloo_processes():
    _check_cp(_spawn_cp("cpu", "float32"), _one_process("cpu", torch.float32), 1e-5)


@pytest.mark.gpu
@pytest.mark.distributed
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
@pytest.mark.parametrize(("dtype", "tol"), [("float32", 1e-5), ("bfloat16", 2e-2)])
def test_diffusers_ring_and_ulysses_on_two_gpus(dtype, tol):
    _check_cp(_spawn_cp("cuda", dtype), _one_process("cuda:0", getattr(torch, dtype)), tol)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_native_ring_op_on_cuda_uses_flash_with_lse():
    q, k, v = (x.cuda().bfloat16() for x in _qkv(outliers=False))
    out, lse = mxattention_forward_op(None, q, k, v, return_lse=True, native=True)
    fp_out, fp_lse = mxattention_forward_op(None, q, k, v, return_lse=True, method="fp")
    assert out.dtype == torch.bfloat16 and lse.shape == (B, SQ, H) and lse.dtype == torch.float32
    assert rel_l2(out, fp_out) < 1e-2
    torch.testing.assert_close(lse, fp_lse, atol=2e-2, rtol=1e-3)
    merged, merged_lse = _split_merge("fp", q, k, v, 2, native=True)  # torch flash chunks, merged
    assert rel_l2(merged, fp_out) < 1e-2
    torch.testing.assert_close(merged_lse, fp_lse, atol=2e-2, rtol=1e-3)
