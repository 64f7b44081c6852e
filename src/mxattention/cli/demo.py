"""Run both real models (terrain diffusion UNet, MiniLM) with the paper's methods and write a report.

Prints the headline table and writes report.md with figures (heightmaps side by side with their
difference maps, per-layer errors, the row-sum study) plus study.json with every number.
The README's results table comes from the full study (`python -m mxattention.eval.study`, more
seeds); the demo is its quick slice, so its numbers differ from the README's (see report.md).
"""

from __future__ import annotations

import argparse
import sys

from mxattention.cli._args import (
    add_run_options,
    check_methods,
    check_out_dir,
    check_unique,
    int_in,
    methods_help,
    seed_arg,
)

NAME = "demo"
HELP = "run the real models with fp, OCP, NVFP4, Sage and MXAttention; write a report with pictures"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mxattention.eval.demo import DEMO_METHODS

    parser.add_argument(
        "--out", default="reports/demo", help="report folder, created with its parents if missing"
    )
    parser.add_argument(
        "--texts", type=int_in(1), default=16, help="MiniLM sentences (at most the pool of sentences)"
    )
    parser.add_argument(
        "--seeds",
        type=seed_arg,
        nargs="+",
        default=[0, 1],
        help="terrain seeds, paired across methods",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=list(DEMO_METHODS),
        help=methods_help("methods (fp is always added as the reference)"),
    )
    add_run_options(parser)


def _max_texts() -> int | None:
    try:
        from mxattention.eval.models.minilm import max_texts
    except ImportError:
        return None
    return max_texts()


def run(args: argparse.Namespace) -> int:
    parser = args.parser
    check_methods(parser, args.methods)
    check_unique(parser, "--seeds", args.seeds)
    out = check_out_dir(parser, "--out", args.out)
    limit = _max_texts()
    if limit is not None and args.texts > limit:
        parser.error(
            f"argument --texts: at most {limit} (the sentences this Python's docstrings give), got {args.texts}"
        )
    if "fp" not in args.methods:
        args.methods = ["fp", *args.methods]
    try:
        from mxattention.eval.demo import run_demo, summary_table
        from mxattention.eval.runtime import quiet_third_party_logs, use_threads
    except ImportError as exc:
        print(
            f"mxattention demo: a package it needs is missing ({exc.name}); run scripts/setup.sh",
            file=sys.stderr,
        )
        return 1
    flags = ["--out", str(out), "--texts", str(args.texts), "--seeds", *map(str, args.seeds)]
    flags += ["--methods", *args.methods]
    quiet_third_party_logs()
    use_threads(args.threads)
    res = run_demo(out, args.methods, args.texts, args.seeds, argv=flags, show_progress=not args.no_progress)
    print(summary_table(res))
    print(f"\nreport: {out / 'report.md'}  ({res['meta']['demo_seconds']:.0f} s)")
    return 0
