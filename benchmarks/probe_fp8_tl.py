"""Probe: how fast can a plain Triton (`tl`) attention forward run on FP8 against bf16 on this GPU?

No quantization work at all: Q K^T and P V on bf16 or float8e4nv operands (V stored transposed for
FP8, the K-major B operand Hopper's FP8 wgmma reads), an online softmax in fp32, fresh accumulator
per key tile for FP8 (`O * alpha + acc`). The ceiling a `tl` FP8 fast mode could reach, beside
cuDNN's bf16 SDPA in the same process (issue 29; benchmarks/NOTES.md). Writes <out>/<name>.json.

    python benchmarks/probe_fp8_tl.py --out /tmp/out
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attention import _bench, run_meta


@triton.jit
def _fwd(Q, K, V, O, qk_scale, L, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, FP8: tl.constexpr):
    pid, bh = tl.program_id(0), tl.program_id(1)
    rows = pid * BM + tl.arange(0, BM)
    d = tl.arange(0, D)
    base = bh.to(tl.int64) * L * D
    q = tl.load(Q + base + rows[:, None] * D + d[None, :], mask=rows[:, None] < L, other=0.0)
    m = tl.full([BM], float("-inf"), tl.float32)
    l_sum = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for start in tl.range(0, L, BN, num_stages=3):
        cols = start + tl.arange(0, BN)
        k = tl.load(K + base + cols[:, None] * D + d[None, :], mask=cols[:, None] < L, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(cols[None, :] < L, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m - m_new)
        l_sum = l_sum * alpha + tl.sum(p, 1)
        if FP8:
            # V is stored transposed ([D, L] per head): the tile [BN, D] is read K-major.
            v = tl.load(V + base + d[None, :] * L + cols[:, None], mask=cols[:, None] < L, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.float8e4nv), v)
        else:
            v = tl.load(V + base + cols[:, None] * D + d[None, :], mask=cols[:, None] < L, other=0.0)
            acc = tl.dot(p.to(tl.bfloat16), v, acc * alpha[:, None])
        m = m_new
    out = acc / l_sum[:, None]
    tl.store(O + base + rows[:, None] * D + d[None, :], out.to(tl.bfloat16), mask=rows[:, None] < L)


def attention(q, k, v, fp8: bool, bm: int, bn: int, warps: int) -> torch.Tensor:
    """q, k, v [BH, L, D] (fp8: v [BH, D, L]); O [BH, L, D] bf16."""
    bh, n, d = q.shape
    out = torch.empty(bh, n, d, device=q.device, dtype=torch.bfloat16)
    grid = (triton.cdiv(n, bm), bh)
    _fwd[grid](q, k, v, out, d**-0.5 * 1.4426950408889634, n, d, bm, bn, fp8, num_warps=warps)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=40)
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--rep-ms", type=float, default=100.0)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--name", default="probe_fp8_tl")
    args = ap.parse_args(argv)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    h, n, d = args.heads, args.seq, args.dim
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(h, n, d, device="cuda", generator=g).bfloat16() for _ in range(3))
    flops = 4 * h * n * n * d
    rows = {}

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None])

    ms, _ = _bench(cudnn, args.rep_ms)
    rows["sdpa_cudnn"] = {"ms": ms}
    ref = cudnn()[0].float()
    q8, k8 = (t.to(torch.float8_e4m3fn) for t in (q, k))
    vt8 = v.transpose(1, 2).contiguous().to(torch.float8_e4m3fn)
    for fp8 in (False, True):
        for bm, bn, warps in ((128, 64, 8), (128, 128, 8), (64, 128, 4)):
            name = f"{'fp8' if fp8 else 'bf16'}-{bm}x{bn}x{warps}"
            a = (q8, k8, vt8) if fp8 else (q, k, v)
            try:
                ms, _ = _bench(
                    lambda a=a, fp8=fp8, bm=bm, bn=bn, w=warps: attention(*a, fp8, bm, bn, w), args.rep_ms
                )
                err = float((attention(*a, fp8, bm, bn, warps).float() - ref).norm() / ref.norm())
                rows[name] = {"ms": ms, "rel_l2_vs_cudnn": err}
            except Exception as exc:  # a config that does not build is a row saying so
                rows[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            print(name, rows[name], flush=True)
    for row in rows.values():
        if "ms" in row:
            row["tflops"] = flops / row["ms"] / 1e9
            row["vs_cudnn"] = rows["sdpa_cudnn"]["ms"] / row["ms"]
    report = {"meta": run_meta(), "shape": [1, h, n, n, d], "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    for name, row in rows.items():
        print(f"{name:24s} {row}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
