"""Entry point of the `mxattention` command: argparse with one subparser per subcommand module.

Exit codes: 0 success, 1 the work failed (a file could not be written), 2 bad arguments or a missing
optional package (named with the command that installs it), 130 interrupted, 141 the reader of
stdout went away (`| head`). Errors are one line in plain words on stderr, never a traceback, and bad
arguments are found before any work starts. Output folders (`--out`) and the folders of output files
(`--json`, `--plot`) are created with their parents when missing; a file where a folder is expected is
an error. Warnings raised while a command runs are printed as one line, `mxattention: warning: ...`.

Only the module of the subcommand named on the command line is imported (it registers its options),
so `--help` and `--version` load neither torch nor any subcommand.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from collections.abc import Iterable, Sequence

from mxattention._version import __version__
from mxattention.cli._args import CliParser, HelpFormatter

# name -> (module with add_arguments(parser) and run(args) -> int, one-line help); the module's
# docstring is the subcommand's description.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "mxattention.cli.demo",
        "run the real models with fp, OCP, NVFP4, Sage and the MXAttention presets; write a report with pictures",
    ),
    "theory": (
        "mxattention.cli.theory",
        "rule table and optimal scaling boundary (why 7.25), optionally Figure 2",
    ),
    "diagnose": (
        "mxattention.cli.diagnose",
        "row-sum study, q sweep and per-method errors on saved Q/K/V or live model captures",
    ),
    "eval": (
        "mxattention.cli.evaluate",
        "paired-seed quality report of a diffusers pipeline: FP vs each method, with frame grids",
    ),
    "bench": ("mxattention.cli.bench", "time attention methods against torch SDPA on this device"),
}
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for `yes | head`


def build_parser(commands: Iterable[str] | None = None) -> CliParser:
    """The top-level parser. The subcommands in `commands` (default: all) get their options, which
    imports their modules; the others only their name and help line (enough for the top-level --help)."""
    load = set(COMMANDS) if commands is None else set(commands)
    parser = CliParser(
        prog="mxattention",
        description="MXAttention: 4-bit MXFP4 attention with Universal Optimal Scaling and PNQ.",
        epilog="`mxattention COMMAND --help` describes each command and lists the methods it takes.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        if name not in load:
            sub.add_parser(name, help=help_text)
            continue
        mod = importlib.import_module(module_name)
        p = sub.add_parser(name, help=help_text, description=mod.__doc__, formatter_class=HelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(run=mod.run, parser=p)
    return parser


def _named_command(argv: Sequence[str]) -> list[str]:
    """The subcommand `argv` names ([] if none): its first word that is not an option (the top-level
    options, --help and --version, take no value)."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return [first] if first in COMMANDS else []


def _show_warning(msg: warnings.WarningMessage) -> None:
    """How the command line shows a warning: one line on stderr without file:line (the frame a library
    warning is attributed to, the first outside the libraries, is the console script here)."""
    text = " ".join(str(msg.message).split()).removeprefix("mxattention: ")
    print(
        f"mxattention: warning: {text} ({msg.category.__name__})",
        file=sys.stderr if msg.file is None else msg.file,
    )


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
    argv = sys.argv[1:] if argv is None else list(argv)
    with warnings.catch_warnings():  # restores the hook below on the way out
        # The hook behind warnings.showwarning (which still wins if a user replaced it), not
        # showwarning itself: a public function of `warnings` replaced by ours would drop its docstring
        # from the sentences MiniLM embeds (eval.models.minilm draws them from stdlib docstrings).
        warnings._showwarnmsg_impl = _show_warning  # type: ignore[attr-defined]
        try:
            parser = build_parser(_named_command(argv))
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
