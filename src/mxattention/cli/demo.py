"""Run both real models (terrain diffusion UNet, MiniLM) with the paper's methods and write a report.

Prints the headline table and writes report.md with figures (heightmaps side by side with their
difference maps, per-layer errors, the row-sum study) plus study.json with every number.
The README's results table comes from the full study (`python -m mxattention.eval.study`, more
seeds); the demo is its quick slice, so its numbers differ from the README's (see report.md).
"""

from __future__ import annotations

import argparse

from mxattention.cli import _requires
from mxattention.cli._args import (
    add_run_options,
    check_methods,
    check_out_dir,
    check_unique,
    ensure_out_dir,
    int_in,
    methods_help,
    seed_arg,
)


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
        default=[0, 1, 2, 3],
        help="terrain seeds, paired across methods (the study's four: one seed's PSNR can differ from "
        "another's by tens of dB)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=list(DEMO_METHODS),
        help=methods_help("methods (fp is always added as the reference)"),
    )
    add_run_options(parser)


def needed_modules(args: argparse.Namespace) -> list[str]:
    """The optional packages (import names) the demo imports: both models, the metrics, the figures."""
    return [
        *_requires.TERRAIN,
        *_requires.MINILM,
        "skimage",
        "matplotlib",
        *([] if args.no_progress else ["tqdm"]),
    ]


def run(args: argparse.Namespace) -> int:
    parser = args.parser
    check_methods(parser, args.methods)
    check_unique(parser, "--seeds", args.seeds)
    out = check_out_dir(parser, "--out", args.out)
    _requires.require(parser, needed_modules(args), "the demo")
    from mxattention.eval.models.minilm import max_texts

    if args.texts > max_texts():
        parser.error(
            f"argument --texts: at most {max_texts()} (the sentences this Python's docstrings give), got {args.texts}"
        )
    if "fp" not in args.methods:
        args.methods = ["fp", *args.methods]
    ensure_out_dir(parser, "--out", out)

    from mxattention.eval.demo import run_demo, summary_table
    from mxattention.eval.runtime import process_start_time, quiet_third_party_logs, use_threads

    flags = ["--out", str(out), "--texts", str(args.texts), "--seeds", *map(str, args.seeds)]
    flags += ["--methods", *args.methods]
    quiet_third_party_logs()
    use_threads(args.threads)
    res = run_demo(
        out,
        args.methods,
        args.texts,
        args.seeds,
        argv=flags,
        show_progress=not args.no_progress,
        started=process_start_time(),
    )
    print(summary_table(res))
    # The same number as report.md's and study.json's: the wall time from the process start.
    print(
        f"\nreport: {out / 'report.md'}  ({res['meta']['seconds']:.0f} s from the {res['meta']['seconds_from']})"
    )
    return 0
