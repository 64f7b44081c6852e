"""Time attention methods against torch SDPA on this machine's device (GPU kernels where present).

For the full H200 benchmark (cuDNN / flash backends, the pre-pass, many shapes) see
benchmarks/bench_attention.py; for the casts, benchmarks/bench_formats.py.
"""

from __future__ import annotations

import argparse

from mxattention.cli._args import check_head_dim, check_methods, device_arg, int_in, methods_help


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


def run(args: argparse.Namespace) -> int:
    import torch

    from mxattention.eval.bench import bench_methods, plan_methods

    check_methods(args.parser, args.methods)
    check_head_dim(args.parser, "--shape", args.shape[-1], args.methods)
    dtype = getattr(torch, args.dtype)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.plan:
        for plan in plan_methods(args.shape, args.methods, device=str(device), dtype=dtype):
            # A call the kernels do not serve runs the reference: its plan is that one line, not the
            # kernel plan the interpreter would follow.
            print(
                plan if plan.reason is None else f"plan of {plan.method}: PyTorch reference ({plan.reason})"
            )
    rows = bench_methods(args.shape, args.methods, device=str(device), dtype=dtype, repeat=args.repeat)
    print(f"shape {args.shape} {args.dtype} on {device}")
    # A CPU computes a few GFLOP/s: TFLOP/s would print 0.000.
    unit, per = ("TFLOP/s", 1.0) if device.type == "cuda" else ("GFLOP/s", 1e3)
    for r in rows:
        print(f"{r['name']:26s} {r['ms']:10.2f} ms {r['tflops'] * per:9.3f} {unit} {r['vs_sdpa']:7.3f}x sdpa")
    return 0
