"""Run the fused kernels and the reference on the same inputs and measure how far apart they are."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import pytest
import torch

import mxattention.attention.reference as reference_module
from mxattention.attention.config import AttentionConfig, get_method
from mxattention.attention.reference import cast_output, reference_attention
from mxattention.kernels.fused import fused_attention


@dataclass
class Comparison:
    rel_l2: float  # ||O_kernel - O_ref|| / ||O_ref||
    quant_rel_l2: float  # ||O_ref - O_fp|| / ||O_fp||: the method's own quantization error
    lse_max_abs: float  # over rows where both are finite
    p_decisions: int  # Q(P~) elements the two computed (every key of every tile that ran)
    p_differ: int  # of those, how many got a different value (code or scale)
    max_row_flips: int  # the most differing decisions in one row
    out: torch.Tensor
    lse: torch.Tensor
    ref_out: torch.Tensor
    ref_lse: torch.Tensor


def skip_unless_path_runs(path: str | None, device: str) -> None:
    """Skip where the kernels refuse `path`: "dot_scaled" on a GPU without native MX MMAs
    (`plan.dot_scaled_refusal`, e.g. the H200)."""
    if path == "dot_scaled" and device == "cuda":
        from mxattention.kernels.plan import dot_scaled_refusal
        from mxattention.kernels.targets import current_target, native_mx

        target = current_target(device)
        if target is not None and not native_mx(target):
            pytest.skip(dot_scaled_refusal(target))


def _recorded_reference(q, k, v, cfg, mask, is_causal, scale):
    tiles: list[torch.Tensor] = []
    original = reference_module.quantize_p

    def recording(p_tilde, cfg_):
        p_hat = original(p_tilde, cfg_)
        tiles.append(p_hat.clone())
        return p_hat

    reference_module.quantize_p = recording
    try:
        out, lse = reference_attention(q, k, v, cfg, mask=mask, is_causal=is_causal, scale=scale)
    finally:
        reference_module.quantize_p = original
    return out, lse, torch.cat(tiles, dim=-1)


def compare(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cfg: AttentionConfig | str,
    *,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    device: str = "cpu",
    matrix_path: str | None = None,
    block_m: int | None = None,
    kv_layout: str | None = None,
) -> Comparison:
    """Kernel vs `reference_attention` on [B, H, L, D] inputs (kv heads repeated for the reference).

    Both run on `device`; the tensors in the result stay there.
    """
    skip_unless_path_runs(matrix_path, device)
    cfg = get_method(cfg)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    b, hq, lq, _ = q.shape
    lk = k.shape[2]
    full_mask = None if mask is None else mask.expand(b, hq, lq, lk)
    out, lse, p_dbg = fused_attention(
        q.to(device),
        k.to(device),
        v.to(device),
        cfg,
        mask=None if full_mask is None else full_mask.to(device),
        is_causal=is_causal,
        scale=scale,
        matrix_path=matrix_path,
        block_m=block_m,
        kv_layout=kv_layout,
        debug_p=True,
    )
    out, lse, p_dbg = out.float(), lse, p_dbg
    group = hq // k.shape[1]
    kr = k.to(device).float().repeat_interleave(group, 1)
    vr = v.to(device).float().repeat_interleave(group, 1)
    qf = q.to(device).float()
    full_mask = None if full_mask is None else full_mask.to(device)
    ref_out, ref_lse, p_ref = _recorded_reference(qf, kr, vr, cfg, full_mask, is_causal, scale)
    ref_out = cast_output(ref_out, q.dtype).float()  # the public function returns the input dtype
    fp_out, _ = reference_attention(
        qf, kr, vr, get_method("fp"), mask=full_mask, is_causal=is_causal, scale=scale
    )
    n = p_ref.shape[-1]
    # Keys the reference never reached (causal early exit) are zero in both.
    p_k = p_dbg[..., :n]
    if is_causal:
        p_ref = torch.nn.functional.pad(p_ref, (0, p_k.shape[-1] - n))
    p_k, p_ref = p_k[..., :lk], p_ref[..., :lk]
    both = torch.isfinite(lse) & torch.isfinite(ref_lse)
    # Norms in float64: outputs near the ends of the fp32 range (extreme-scale tests) overflow a
    # float32 sum of squares.
    out64, ref64, fp64 = out.double(), ref_out.double(), fp_out.double()
    return Comparison(
        rel_l2=((out64 - ref64).norm() / ref64.norm().clamp_min(1e-300)).item(),
        quant_rel_l2=((ref64 - fp64).norm() / fp64.norm().clamp_min(1e-300)).item(),
        lse_max_abs=(lse - ref_lse)[both].abs().max().item() if both.any() else 0.0,
        p_decisions=p_ref.numel(),
        p_differ=int((p_k != p_ref).sum()),
        max_row_flips=int((p_k != p_ref).sum(-1).max()) if p_ref.numel() else 0,
        out=out,
        lse=lse,
        ref_out=ref_out,
        ref_lse=ref_lse,
    )


def qkv(b, hq, hk, lq, lk, d, dv=None, *, seed=0, outliers=True, dtype=torch.float32):
    """Random Q, K, V with channel outliers, exact zeros and repeated (tied) rows."""
    g = torch.Generator().manual_seed(seed)
    dv = dv or d
    q = torch.randn(b, hq, lq, d, generator=g)
    k = torch.randn(b, hk, lk, d, generator=g)
    v = torch.randn(b, hk, lk, dv, generator=g)
    if outliers:
        q = q * torch.exp(torch.randn(d, generator=g))
        k = k * torch.exp(torch.randn(d, generator=g)) + 2.0 * torch.randn(d, generator=g)
        v = v * torch.exp(0.5 * torch.randn(dv, generator=g))
    q[:, :, 1] = 0.0  # a row of exact ties: every score 0, P~ = 1 everywhere
    k[:, :, 2] = k[:, :, 3]  # two identical keys
    v[:, :, 4] = 0.0
    return q.to(dtype), k.to(dtype), v.to(dtype)


T = TypeVar("T")


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[], T]) -> T:
    """`make()` (a JSON value) once per test run. Under xdist each worker that gets one of a module's
    tests sets up that module's fixtures, so an offline build shared by a module's tests would run
    in both workers: the first writes its result in the run's folder, the other waits and reads it."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return make()
    import fcntl  # POSIX: the CI's Linux

    path = tmp_path_factory.getbasetemp().parent / f"{name}.json"  # this run's, shared by its workers
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return json.loads(path.read_text())
        result = make()
        path.write_text(json.dumps(result))
        return result
