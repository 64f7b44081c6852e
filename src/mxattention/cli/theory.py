"""Why 7.25: the OCP / TFS / UOS rule table, the optimal boundary of every ladder, and Figure 2.

Prints, for one element ladder (e2m1 unless --elem) or all of them (--all-elems), each rule's
shared-exponent formula, boundary, range of the normalized block max, saturating interval and its
probability, and the objective J under log-uniform block maxima; then q* of every ladder, exactly.
--plot draws the paper's Figure 2 (J(q) for several phase densities, each relative to its own
minimum, q from the ladder's max to the next power of two: 6..8 for e2m1); --json saves the numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from mxattention.cli import _requires
from mxattention.cli._args import check_out_file, ensure_out_dir, write_parents
from mxattention.eval.plots import plot_figure2, theory_q_grid
from mxattention.formats.ladders import LADDERS, get_ladder
from mxattention.theory import (
    Interval,
    J,
    PhaseDensity,
    RuleRow,
    brute_force_boundary,
    figure_densities,
    optimal_boundary,
    optimal_boundary_exact,
    rule_table,
)

PLOT_SUFFIXES = (".png", ".pdf", ".svg")
TABLE_GRID_STEPS = 40  # 6.00..8.00 step 0.05 for e2m1, as in the paper's sweep


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of `mxattention theory`."""
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--elem",
        type=str.lower,
        choices=sorted(LADDERS),
        default="e2m1",
        help="element ladder of the rule table and figure",
    )
    which.add_argument("--all-elems", action="store_true", help="print the rule table of every ladder")
    parser.add_argument(
        "--plot",
        metavar="PATH",
        help=f"save Figure 2 ({'/'.join(PLOT_SUFFIXES)}); missing folders are created (default: no figure)",
    )
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="write the numbers as JSON; missing folders are created (default: none)",
    )


def _interval_json(iv: Interval | None) -> dict[str, Any] | None:
    if iv is None:
        return None
    return {
        "low": iv.low,
        "high": iv.high,
        "low_closed": iv.low_closed,
        "high_closed": iv.high_closed,
        "text": str(iv),
    }


def _row_json(row: RuleRow) -> dict[str, Any]:
    return {
        "rule": row.rule,
        "exponent": row.exponent,
        "boundary": row.boundary,
        "normalized_max_range": _interval_json(row.normalized_max_range),
        "overflow_interval": _interval_json(row.overflow_interval),
        "overflow_probability": row.overflow_probability,
        "j_loguniform": row.j_loguniform,
    }


def _objective_curves(elem: str, densities: dict[str, PhaseDensity]) -> dict[str, Any]:
    qs = theory_q_grid(elem, TABLE_GRID_STEPS)
    return {
        "q": qs.tolist(),
        "densities": {
            name: {
                "label": d.label,
                "J": np.asarray(J(qs, elem, d)).tolist(),
                "grid_argmin": brute_force_boundary(elem, d, qs),
            }
            for name, d in densities.items()
        },
    }


def _format_table(elem: str, rows: list[RuleRow]) -> str:
    lad = get_ladder(elem)
    j_uos = next(r.j_loguniform for r in rows if r.rule == "uos")
    head = (
        "rule",
        "exponent",
        "boundary",
        "M/sigma range",
        "saturates on",
        "P(saturate)",
        "J log-unif",
        "J/J_uos",
    )
    body = [
        (
            r.rule,
            r.exponent,
            f"{r.boundary:.17g}",
            str(r.normalized_max_range),
            "none" if r.overflow_interval is None else str(r.overflow_interval),
            f"{r.overflow_probability:.6f}",
            f"{r.j_loguniform:.6e}",
            f"{r.j_loguniform / j_uos:.6f}",
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in (head, *body)) for i in range(len(head))]
    lines = [f"Shared-scale rules for {lad.name} (max {lad.max_value:g}), log-uniform block maxima:"]
    for line in (head, *body):
        lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    return "\n".join(lines)


def _format_boundaries() -> str:
    lines = ["Optimal UOS boundary q* (the root of E(q) = 8 E(q/2)) of every ladder:"]
    for name in sorted(LADDERS):
        exact = optimal_boundary_exact(name)
        lines.append(f"  {name}  q* = {optimal_boundary(name)!r:<20} exactly {exact}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run `mxattention theory`; returns the exit code."""
    parser: argparse.ArgumentParser = args.parser
    plot_path = check_out_file(parser, "--plot", args.plot, PLOT_SUFFIXES)
    json_path = check_out_file(parser, "--json", args.json)
    elems = sorted(LADDERS) if args.all_elems else [args.elem]
    if plot_path is not None:
        _requires.require(parser, ["matplotlib"], "--plot")
    for option, path in (("--json", json_path), ("--plot", plot_path)):
        if path is not None:  # before the table is printed: a path that cannot be written is a usage error
            ensure_out_dir(parser, option, path.parent)

    report: dict[str, Any] = {"elems": {}, "optimal_boundaries": {}}
    for elem in elems:
        rows = rule_table(elem)
        print(_format_table(elem, rows), end="\n\n")
        report["elems"][elem] = {
            "max_value": get_ladder(elem).max_value,
            "rules": [_row_json(r) for r in rows],
            "objective": _objective_curves(elem, figure_densities()),
        }
    print(_format_boundaries())
    for name in sorted(LADDERS):
        report["optimal_boundaries"][name] = {
            "value": optimal_boundary(name),
            "exact": str(optimal_boundary_exact(name)),
            "stored": get_ladder(name).uos_boundary,
        }

    try:
        if json_path is not None:
            write_parents(json_path).write_text(json.dumps(report, indent=2) + "\n")
            print(f"wrote {json_path}")
        if plot_path is not None:
            plot_figure2(write_parents(plot_path), elems[0])
            print(f"wrote {plot_path}")
    except OSError as exc:
        print(
            f"mxattention theory: error: cannot write {exc.filename or 'output'}: {exc.strerror}",
            file=sys.stderr,
        )
        return 1
    return 0
