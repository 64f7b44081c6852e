"""Time attention methods against torch SDPA on this machine's device (GPU kernels where present).

For the full H200 benchmark (cuDNN / flash backends, the pre-pass, many shapes) see
benchmarks/bench_attention.py; for the casts, benchmarks/bench_formats.py.
"""

from __future__ import annotations

import argparse

from mxattention.cli._args import check_methods, device_arg, int_in, methods_help

NAME = "bench"
HELP = "time attention methods against torch SDPA on this device"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shape",
        type=int_in(1),
        nargs=4,
        default=[1, 4, 2048, 128],
        metavar=("B", "H", "L", "D"),
        help="batch, heads, tokens, head dim of Q, K and V",
    )
    parser.add_argument("--methods", nargs="+", default=["mxfp4-ocp", "mxattention"], help=methods_help())
    parser.add_argument(
        "--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16", help="dtype of Q, K, V"
    )
    parser.add_argument("--repeat", type=int_in(1), default=3, help="timed runs per method (median)")
    parser.add_argument(
        "--device", type=device_arg, default=None, help="cpu, cuda or cuda:N (default: cuda when available)"
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print each method's kernel plan of the case (matrix path, layout, tiles, passes, or the "
        "reason it runs the PyTorch reference) before the timings",
    )


def _check_head_dim(parser: argparse.ArgumentParser, head_dim: int, methods: list[str]) -> None:
    """Each method on one token of head dim D, on the CPU: a method that cannot serve D says so now."""
    import torch

    from mxattention.attention import sdpa_reference

    q = torch.zeros(1, 1, 1, head_dim)
    for m in methods:
        try:
            sdpa_reference(q, q, q, method=m)
        except ValueError as exc:
            parser.error(f"--shape: {m} cannot serve head dim {head_dim}: {exc}")


def run(args: argparse.Namespace) -> int:
    import torch

    from mxattention.eval.bench import bench_methods, plan_methods

    check_methods(args.parser, args.methods)
    _check_head_dim(args.parser, args.shape[-1], args.methods)
    dtype = getattr(torch, args.dtype)
    if args.plan:
        for plan in plan_methods(args.shape, args.methods, device=args.device, dtype=dtype):
            print(plan)
    rows = bench_methods(args.shape, args.methods, device=args.device, dtype=dtype, repeat=args.repeat)
    print(f"shape {args.shape} {args.dtype}")
    for r in rows:
        print(f"{r['name']:26s} {r['ms']:10.2f} ms {r['tflops']:9.3f} TFLOP/s {r['vs_sdpa']:7.3f}x sdpa")
    return 0
