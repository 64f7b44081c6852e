"""GPU correctness: the fused kernels vs the PyTorch reference at large shapes, compile, CUDA graphs.

Run from the repository root: `PYTHONPATH=src:. python benchmarks/check_kernels_gpu.py --out DIR`.
For each case: rel-L2 of kernel vs reference, the method's own quantization error (reference vs
fp32 attention), the number of Q(P~) decisions that differ, max |lse| difference; then
`torch.compile(fullgraph=True)` and CUDA-graph capture of the public function; then an exhaustive
check that the kernel's exp2 is monotone on every fp32 in [-160, 0] (the attention kernel takes
each P~ block max as exp2 of the score block max). Writes JSON.
Exits 1 if a bound of tests/kernels/test_attention_kernel.py is broken.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import torch
import triton
import triton.language as tl

from mxattention.attention.config import get_method

CASES = [
    # label, method, (B, Hq, Hkv, Lq, Lk, D), extras
    ("full-4k", "mxattention", (1, 8, 8, 4096, 4096, 128), {}),
    ("ocp-direct-4k", "mxfp4-ocp", (1, 8, 8, 4096, 4096, 128), {}),
    ("full-causal", "mxattention", (1, 4, 4, 3000, 3000, 128), {"is_causal": True}),
    ("full-keymask", "mxattention", (2, 4, 4, 2048, 2500, 128), {"key_mask": True}),
    ("full-gqa-ragged", "mxattention", (1, 16, 4, 3001, 4999, 128), {}),
    ("full-d64", "mxattention", (1, 8, 8, 4096, 4096, 64), {}),
    ("full-cross", "mxattention", (1, 8, 8, 8192, 512, 128), {}),
    ("full-d80-additive", "mxfp4-ocp-hadamard-pnq", (1, 4, 4, 1000, 1500, 80), {"additive": True}),
    ("full-4k-dot_scaled", "mxattention", (1, 4, 4, 2048, 2048, 128), {"matrix_path": "dot_scaled"}),
    ("full-4k-packed-kv", "mxattention", (1, 8, 8, 4096, 4096, 128), {"kv_layout": "packed"}),
    ("full-hard-values", "mxattention", (1, 4, 4, 2048, 2048, 128), {"hard": True}),
    (
        "full-causal-bn32",
        get_method("mxattention").with_tiles(block_n=32),
        (1, 4, 4, 3000, 3000, 128),
        {"is_causal": True},
    ),
    ("ocp-causal-gqa", "mxfp4-ocp", (1, 8, 2, 2500, 2500, 64), {"is_causal": True}),
]


@triton.jit
def _exp2_monotone_kernel(Count, n, BLOCK: tl.constexpr):
    k = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = -(k.to(tl.float32, bitcast=True))  # k = 0, 1, ...: 0, -tiny, ..., decreasing
    y = -((k + 1).to(tl.float32, bitcast=True))
    bad = (tl.math.exp2(y) > tl.math.exp2(x)) & (k < n)
    tl.atomic_add(Count, tl.sum(bad.to(tl.int32)))


def exp2_monotone_violations(lo: float = -160.0, device: str = "cuda") -> dict:
    """Count x in [lo, 0] (every fp32) where exp2(next float below x) > exp2(x), with tl.math.exp2."""
    n = int(torch.tensor([-lo], dtype=torch.float32).view(torch.int32).item())
    count = torch.zeros(1, dtype=torch.int32, device=device)
    block = 4096
    _exp2_monotone_kernel[(triton.cdiv(n, block),)](count, n, BLOCK=block)
    return {"checked": n, "range": [lo, 0.0], "violations": int(count.item())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results", help="folder for check_kernels_gpu.json")
    args = ap.parse_args(argv)
    import mxattention as mx
    from mxattention.ops import errors as op
    from tests.kernels.helpers import compare, qkv

    report, ok = {"gpu": torch.cuda.get_device_name(), "cases": []}, True
    for label, method, (b, hq, hk, lq, lk, d), extra in CASES:
        t0 = time.time()
        q, k, v = qkv(b, hq, hk, lq, lk, d, seed=len(label))
        mask = None
        if extra.get("key_mask"):
            mask = torch.rand(b, 1, 1, lk) > 0.2
            mask[-1, ..., 100:] = False
        if extra.get("additive"):
            mask = torch.randn(1, 1, lq, lk) * 2
        if extra.get("hard"):
            # Ties, powers of two, q * 2**k boundaries and tiny blocks in Q, K and V (scaled to sane scores).
            from mxattention.formats.ladders import E2M1
            from tests.formats.hard_values import hard_values

            hv = [hard_values(E2M1, b * hk * lk * d, seed=s).view(b, hk, lk, d) for s in (1, 2, 3)]
            hv = [torch.where(t.abs() < 1e4, t, 0.0) for t in hv]
            q, k, v = hv[0] * 1e-2, hv[1] * 1e-2, hv[2]
        try:
            c = compare(
                q, k, v, method, mask=mask, is_causal=extra.get("is_causal", False), device="cuda",
                matrix_path=extra.get("matrix_path"), kv_layout=extra.get("kv_layout"),
            )  # fmt: skip
            row = {
                "rel_l2": c.rel_l2, "quant_rel_l2": c.quant_rel_l2, "lse_max_abs": c.lse_max_abs,
                "p_decisions": c.p_decisions, "p_differ": c.p_differ, "max_row_flips": c.max_row_flips,
                "pass": bool(
                    c.rel_l2 <= 1e-3 * c.quant_rel_l2 and c.p_differ <= 1e-3 * c.p_decisions
                    and c.lse_max_abs <= 1e-4 + 0.6 * c.max_row_flips and torch.isfinite(c.out).all()
                ),
            }  # fmt: skip
        except Exception as e:
            row = {"error": f"{type(e).__name__}: {str(e)[:400]}", "pass": False}
        row.update(
            label=label,
            method=str(getattr(method, "name", method)),
            shape=[b, hq, hk, lq, lk, d],
            seconds=round(time.time() - t0, 1),
        )
        ok &= row["pass"]
        print(json.dumps(row), flush=True)
        report["cases"].append(row)
        torch.cuda.empty_cache()

    q, k, v = (t.cuda().half() for t in qkv(1, 8, 8, 1024, 1024, 128, seed=12))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", op.ReferenceFallbackWarning)
            eager = mx.scaled_dot_product_attention(q, k, v)
            compiled = torch.compile(lambda q, k, v: mx.scaled_dot_product_attention(q, k, v), fullgraph=True)
            comp_equal = bool(torch.equal(compiled(q, k, v), eager))
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                mx.scaled_dot_product_attention(q, k, v)
                with torch.cuda.graph(graph):
                    captured = mx.scaled_dot_product_attention(q, k, v)
            graph.replay()
            torch.cuda.synchronize()
            report["compile_fullgraph_equal"] = comp_equal
            report["cuda_graph_equal"] = bool(torch.equal(captured, eager))
    except Exception as e:
        report["compile_graph_error"] = f"{type(e).__name__}: {str(e)[:400]}"
    ok &= bool(report.get("compile_fullgraph_equal")) and bool(report.get("cuda_graph_equal"))
    report["exp2_monotone"] = exp2_monotone_violations()
    ok &= report["exp2_monotone"]["violations"] == 0
    print({k: v for k, v in report.items() if k != "cases"}, flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "check_kernels_gpu.json").write_text(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
