"""Entry point of the `mxattention` command: argparse with one subparser per subcommand module.

Exit codes: 0 success, 1 the work failed (a file could not be written, an optional package is
missing), 2 bad arguments, 130 interrupted, 141 the reader of stdout went away (`| head`).
Errors are one line in plain words on stderr, never a traceback, and bad arguments are found
before any work starts. Output folders (`--out`) and the folders of output files (`--json`,
`--plot`) are created with their parents when missing; a file where a folder is expected is an error.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from types import ModuleType

from mxattention import __version__
from mxattention.cli import bench, demo, diagnose, evaluate, theory
from mxattention.cli._args import CliParser, HelpFormatter, methods_help

SUBCOMMANDS: tuple[ModuleType, ...] = (demo, theory, diagnose, evaluate, bench)
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for `yes | head`


def build_parser() -> CliParser:
    """The top-level parser with every registered subcommand."""
    parser = CliParser(
        prog="mxattention",
        description="MXAttention: 4-bit MXFP4 attention with Universal Optimal Scaling and PNQ.",
        epilog=f"{methods_help('Methods')}. `mxattention COMMAND --help` describes each command.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in SUBCOMMANDS:
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.__doc__, formatter_class=HelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(run=mod.run, parser=p)
    return parser


def _silence_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush does not fail again."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a replaced stdout (tests): nothing to flush
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]) and return its exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        code = int(args.run(args))
        sys.stdout.flush()
        return code
    except SystemExit as exc:  # --help, --version, usage errors (argparse has printed the message)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except KeyboardInterrupt:
        print("mxattention: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `mxattention theory | head`: the reader has all it wanted; say nothing
        _silence_stdout()
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
