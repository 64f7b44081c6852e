"""Run both real models (terrain diffusion UNet, MiniLM) with the paper's methods and write a report.

Prints the headline table and writes report.md with figures (heightmaps side by side with their
difference maps, per-layer errors, the row-sum study) plus study.json with every number.
"""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "demo"
HELP = "run the real models with fp, OCP, NVFP4, Sage and MXAttention; write a report with pictures"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mxattention.eval.demo import DEMO_METHODS

    parser.add_argument("--out", default="reports/demo", help="report folder (default reports/demo)")
    parser.add_argument("--texts", type=int, default=16, help="MiniLM sentences (default 16)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="terrain seeds (default 0 1)")
    parser.add_argument(
        "--methods", nargs="+", default=list(DEMO_METHODS), help="methods (default: the paper's set)"
    )


def run(args: argparse.Namespace) -> int:
    import sys

    from mxattention.cli._args import check_methods

    check_methods(args.parser, args.methods)
    if "fp" not in args.methods:
        args.methods = ["fp", *args.methods]
    if args.texts < 1 or not args.seeds:
        args.parser.error("--texts must be >= 1 and --seeds non-empty")
    try:
        from mxattention.eval.demo import run_demo, summary_table
    except ImportError as exc:
        print(
            f"mxattention demo: a package it needs is missing ({exc.name}); run scripts/setup.sh",
            file=sys.stderr,
        )
        return 1
    out = Path(args.out)
    flags = [
        "--out",
        str(out),
        "--texts",
        str(args.texts),
        "--seeds",
        *map(str, args.seeds),
        "--methods",
        *args.methods,
    ]
    res = run_demo(out, args.methods, args.texts, args.seeds, argv=flags)
    print(summary_table(res))
    print(f"\nreport: {out / 'report.md'}  ({res['meta']['demo_seconds']:.0f} s)")
    return 0
