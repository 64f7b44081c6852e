"""Entry point of the `mxattention` command: argparse with one subparser per subcommand module.

Exit codes: 0 success, 1 the work failed (a file could not be written, an optional package is
missing), 2 bad arguments. Errors are one line in plain words on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from mxattention import __version__
from mxattention.cli import bench, demo, diagnose, evaluate, theory

# Later subcommands (demo, diagnose, eval, bench) are modules with the same four names, added here.
SUBCOMMANDS: tuple[ModuleType, ...] = (demo, theory, diagnose, evaluate, bench)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="mxattention",
        description="MXAttention: 4-bit MXFP4 attention with Universal Optimal Scaling and PNQ.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in SUBCOMMANDS:
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.__doc__)
        mod.add_arguments(p)
        p.set_defaults(run=mod.run, parser=p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]) and return its exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return int(args.run(args))
    except SystemExit as exc:  # --help, --version, usage errors (argparse has printed the message)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except KeyboardInterrupt:
        print("mxattention: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
