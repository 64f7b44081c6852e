"""Time attention methods against torch SDPA on this machine's device (GPU kernels where present).

For the full H200 benchmark (cuDNN / flash backends, the pre-pass, many shapes) see
benchmarks/bench_attention.py; for the casts, benchmarks/bench_formats.py.
"""

from __future__ import annotations

import argparse

NAME = "bench"
HELP = "time attention methods against torch SDPA on this device"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", type=int, nargs=4, default=[1, 4, 2048, 128], metavar=("B", "H", "L", "D"))
    parser.add_argument("--methods", nargs="+", default=["mxfp4-ocp", "mxattention"])
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")


def run(args: argparse.Namespace) -> int:
    import torch

    from mxattention.cli._args import check_methods
    from mxattention.eval.bench import bench_methods

    check_methods(args.parser, args.methods)
    if min(args.shape) < 1 or args.repeat < 1:
        args.parser.error("--shape entries and --repeat must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        args.parser.error("--device cuda: no CUDA device is available here")
    rows = bench_methods(
        args.shape, args.methods, device=args.device, dtype=getattr(torch, args.dtype), repeat=args.repeat
    )
    print(f"shape {args.shape} {args.dtype}")
    for r in rows:
        print(f"{r['name']:26s} {r['ms']:10.2f} ms {r['tflops']:9.3f} TFLOP/s {r['vs_sdpa']:7.3f}x sdpa")
    return 0
