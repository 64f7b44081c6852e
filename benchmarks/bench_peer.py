"""Speed and error of mxattention's methods beside the peer a Hopper user would pick, in one run.

For every shape (B = 1, non-causal, bf16 inputs with per-channel scales, `bench_attention._inputs`):
the median ms of torch SDPA (cuDNN), of SageAttention 1.0.6's Triton kernel (INT8 Q K^T, FP16 P V;
`sageattn`, smooth_k on, as its README recommends) where it imports, and of each mxattention method
through the public entry; each one's ratio to cuDNN, and its error against fp32 attention of the same
bf16 inputs: rel-L2 of O over the first `--error-heads` heads (fp32 torch SDPA, memory-efficient
kernel: no L x L matrix). Writes <out>/<name>.json and <out>/<name>.md with the GPU, date, versions
and command.

    python benchmarks/bench_peer.py --shapes wan14b-16k,cross-32k-512 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attention import SHAPES, _bench, _inputs, _warm_up, run_meta

DEFAULT_SHAPES = ("wan14b-16k", "hunyuan-32k", "cross-32k-512", "wan14b-75k")
DEFAULT_METHODS = ("mxattention", "mxattention-pv8-smooth")


def _paths(methods: list[str]) -> dict:
    """name -> f(q, k, v) for cuDNN, SageAttention (if it imports) and each mxattention method."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import mxattention

    def cudnn(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    paths = {"sdpa_cudnn": cudnn}
    try:
        from sageattention import sageattn

        paths["sageattention-1.0.6"] = lambda q, k, v: sageattn(q, k, v, tensor_layout="HND", is_causal=False)
    except ImportError as exc:  # the peer is optional: the table says it is missing
        print(f"sageattention not importable ({exc}); its rows are left out", flush=True)
    for m in methods:
        paths[m] = lambda q, k, v, m=m: mxattention.scaled_dot_product_attention(q, k, v, method=m)
    return paths


def _rel_l2(out: torch.Tensor, q, k, v, heads: int) -> float:
    """||O - O_fp32|| / ||O_fp32|| over the first `heads` heads; O_fp32: fp32 SDPA (efficient kernel)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qs, ks, vs = (t[:, :heads].float() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        ref = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs)
    diff = out[:, :heads].float() - ref
    return float(diff.norm() / ref.norm())


def run(args) -> dict:
    methods = [m for m in args.methods.split(",") if m]
    paths = _paths(methods)
    shapes = list(DEFAULT_SHAPES) if args.shapes == "all" else args.shapes.split(",")
    report = {"meta": run_meta(), "rep_ms": args.rep_ms, "error_heads": args.error_heads, "shapes": {}}
    for label in shapes:
        h, lq, lk, d = SHAPES[label]
        q, k, v = _inputs(h, lq, lk, d)
        _warm_up((h, lq, lk, d), args.warmup_s, print)
        rows = {}
        for name, fn in paths.items():
            try:
                ms, extra = _bench(functools.partial(fn, q, k, v), args.rep_ms)
                err = _rel_l2(fn(q, k, v), q, k, v, args.error_heads)
                rows[name] = {"ms": ms, "extra_mib": extra, "rel_l2_vs_fp32": err}
            except Exception as exc:  # a failing path is a row that says so, the others still run
                rows[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            print(label, name, rows[name], flush=True)
        base = rows["sdpa_cudnn"].get("ms")
        for row in rows.values():
            if "ms" in row and base:
                row["vs_cudnn"] = base / row["ms"]
        report["shapes"][label] = {"shape": [1, h, lq, lk, d], "rows": rows}
        q = k = v = None  # the next shape's inputs need the memory
        torch.cuda.empty_cache()
    return report


def markdown(report: dict) -> str:
    meta = report["meta"]
    lines = [
        f"# Peer table: {meta['gpu']}",
        "",
        f"- date: {meta['date']}; torch {meta['torch']}, triton {meta['triton']}, python {meta['python']}",
        f"- command: `{meta['command']}`",
        f"- B = 1, non-causal, bf16; ms: median of do_bench ({report['rep_ms']} ms budget); error: rel-L2 of "
        f"O against fp32 SDPA over the first {report['error_heads']} heads",
        "",
        "| shape | path | ms | vs cuDNN | rel-L2 vs fp32 |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for label, entry in report["shapes"].items():
        for name, row in entry["rows"].items():
            if "error" in row:
                lines.append(f"| {label} | {name} | failed: {row['error'][:80]} | | |")
                continue
            lines.append(
                f"| {label} | {name} | {row['ms']:.3f} | {row.get('vs_cudnn', float('nan')):.2f}x | "
                f"{row['rel_l2_vs_fp32']:.3e} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="all", help=f"comma list of {sorted(SHAPES)} or 'all'")
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS), help="comma list of mxattention methods")
    ap.add_argument("--rep-ms", type=float, default=100.0, help="do_bench time budget per path (ms)")
    ap.add_argument("--warmup-s", type=float, default=3.0, help="cuDNN warm-up before each shape (s)")
    ap.add_argument("--error-heads", type=int, default=4, help="heads compared with fp32 attention")
    ap.add_argument("--out", default="benchmarks/results", help="output folder")
    ap.add_argument("--name", default="peer_h200", help="file stem of the JSON and markdown")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_peer: needs a CUDA GPU", file=sys.stderr)
        return 2
    report = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    (out / f"{args.name}.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
