"""Argument handling shared by the subcommands: one parser class, one help format, one wording.

- `CliParser`: usage errors are ONE line on stderr, `mxattention <cmd>: error: <message>`, exit code 2.
- `HelpFormatter`: every option's help ends with its default; descriptions keep their line breaks.
- Argument types (`int_in`, `finite_float`, `device_arg`, `rule`) turn a bad value into a usage error naming the option
  while argparse parses, i.e. before any work starts.
- Output paths (`check_out_dir`, `check_out_file`), the same rule for every command: missing parent
  folders are created when the command writes; an existing file where a folder is expected (or a
  folder where a file is expected, or a file in the way of a folder to create) is a usage error;
  `ensure_out_dir` proves, before the work, that the folder can be created and written (and leaves
  nothing behind).
- `check_head_dim`: a head dim every chosen method can serve.
- `check_methods`, `check_unique`: method names and repeated values.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed's range; numpy's default_rng takes any int >= 0


class CliParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (no usage block) and exit with code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the descriptions' line breaks and ends each option's help with its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or "(default" in text
            or default in (None, False, argparse.SUPPRESS)
            or isinstance(action, argparse._HelpAction | argparse._VersionAction)
        ):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, list | tuple) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


def methods_help(what: str = "methods") -> str:
    """'<what>: fp, mxfp4-ocp, ...': the preset list for help texts."""
    from mxattention.attention.config import list_methods

    return f"{what}, from: {', '.join(list_methods())}"


def int_in(low: int, high: int | None = None, high_text: str | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high] (high None: no upper bound; high_text: how to print it)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            want = f">= {low}" if high is None else f"in {low}..{high_text or high}"
            raise argparse.ArgumentTypeError(f"expected an integer {want}, got {text}")
        return value

    parse.__name__ = "integer"
    return parse


def seed_arg(text: str) -> int:
    """An argparse type: a random seed, 0..2**64-1 (what torch and numpy generators both take)."""
    return int_in(0, SEED_MAX, "2**64-1")(text)


def finite_float(text: str) -> float:
    """An argparse type: a finite float."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text}")
    return value


def device_arg(text: str) -> str:
    """An argparse type: 'cpu', 'cuda' or 'cuda:N' that exists on this machine."""
    import torch

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{text}: no CUDA device is available here; use cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(
                f"{text}: this machine has {torch.cuda.device_count()} CUDA device(s), cuda:0.."
                f"cuda:{torch.cuda.device_count() - 1}"
            )
    return text


def rule(text: str) -> str | float:
    """An argparse type: an E2M1 shared-scale rule, 'ocp' / 'tfs' / 'uos' or a boundary q in (3, 12).

    A boundary q puts the normalized block max in (q/2, q]. The range is the one `QuantSpec` accepts
    (`formats.scale_rules.boundary_reason`): at q <= 3 the top codes are never used (2q is never
    worse), at q >= 12 every block's max saturates.
    """
    from mxattention.formats.ladders import E2M1
    from mxattention.formats.scale_rules import RULE_NAMES, boundary_reason, resolve_rule

    low, high = E2M1.max_value / 2, 2 * E2M1.max_value
    want = f"one of {', '.join(RULE_NAMES)} or a boundary q strictly between {low:g} and {high:g} (e.g. 7.25)"
    value: str | float = text.lower()
    if value not in RULE_NAMES:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
    try:
        resolve_rule(value, E2M1)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected {want}: {exc}") from None
    reason = boundary_reason(value, E2M1) if isinstance(value, float) else None
    if reason is not None:
        raise argparse.ArgumentTypeError(f"expected {want}, got {text}: {reason}")
    return value


def check_methods(parser: argparse.ArgumentParser, methods: Sequence[str], extra: Sequence[str] = ()) -> None:
    """Exit with a usage error (code 2) naming every unknown method and the known ones."""
    from mxattention.attention.config import list_methods

    known = [*list_methods(), *extra]
    bad = [m for m in methods if m not in known]
    if bad:
        parser.error(f"unknown method(s) {', '.join(bad)}; choose from {', '.join(known)}")
    check_unique(parser, "--methods", methods)


def check_unique(parser: argparse.ArgumentParser, option: str, values: Sequence[Any]) -> None:
    """Exit with a usage error if a value is given twice (a repeated seed would be counted twice)."""
    seen: set[Any] = set()
    for v in values:
        if v in seen:
            parser.error(f"{option}: {v} is given twice")
        seen.add(v)


def _check_creatable(parser: argparse.ArgumentParser, option: str, path: Path) -> None:
    """The nearest existing ancestor of `path` must be a writable folder (missing ones get created)."""
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        parser.error(f"{option} {path}: {ancestor} is a file, so no folder can be made under it")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        parser.error(f"{option} {path}: no permission to write in {ancestor}")


def check_out_dir(parser: argparse.ArgumentParser, option: str, value: str | Path) -> Path:
    """An output folder: an existing folder, or one that can be created (with its parents)."""
    path = Path(value)
    if path.exists() and not path.is_dir():
        parser.error(f"{option} {path}: is a file, expected a folder (it is created if missing)")
    if not path.exists():
        _check_creatable(parser, option, path)
    elif not os.access(path, os.W_OK | os.X_OK):
        parser.error(f"{option} {path}: no permission to write in this folder")
    return path


def check_out_file(
    parser: argparse.ArgumentParser, option: str, value: str | Path | None, suffixes: Sequence[str] = ()
) -> Path | None:
    """An output file (None passes through): not a folder, suffix in `suffixes`, parents creatable."""
    if value is None:
        return None
    path = Path(value)
    if path.is_dir():
        parser.error(f"{option} {path}: is a folder, expected a file name")
    if suffixes and path.suffix.lower() not in suffixes:
        parser.error(f"{option} {path}: the file name must end in one of {', '.join(suffixes)}")
    _check_creatable(parser, option, path)
    return path


def check_in_file(parser: argparse.ArgumentParser, option: str, value: str | Path) -> Path:
    """An input file that exists and is a readable file."""
    path = Path(value)
    if not path.exists():
        parser.error(f"{option} {path}: no such file")
    if not path.is_file():
        parser.error(f"{option} {path}: is a folder, expected a file")
    if not os.access(path, os.R_OK):
        parser.error(f"{option} {path}: no permission to read it")
    return path


def ensure_out_dir(parser: argparse.ArgumentParser, option: str, folder: Path) -> Path:
    """Prove that output folder `folder` can be created and written: create it (with its parents), write
    and delete a probe file in it, then remove the folders this made, so that nothing is left if the
    command stops later. A folder that cannot be written (a read-only or virtual file system such as
    /proc, which `os.access` does not see) is a usage error before the work starts. Call it after every
    other check."""
    import tempfile

    made = []
    path = folder
    while not path.exists() and path != path.parent:
        made.append(path)
        path = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        parser.error(f"{option}: cannot write in {folder}: {exc.strerror or exc}")
    finally:
        for path in made:  # deepest first
            with contextlib.suppress(OSError):
                path.rmdir()
    return folder


def check_head_dim(
    parser: argparse.ArgumentParser, option: str, head_dim: int, methods: Sequence[str]
) -> None:
    """Each method on one token of head dim `head_dim`, on the CPU: one that cannot serve it is a usage
    error naming `option`, the method and the reason (the method's own ValueError)."""
    import torch

    from mxattention.attention import sdpa_reference

    q = torch.zeros(1, 1, 1, head_dim)
    for m in methods:
        try:
            sdpa_reference(q, q, q, method=m)
        except ValueError as exc:
            parser.error(f"{option}: {m} cannot serve head dim {head_dim}: {exc}")


def write_parents(path: Path) -> Path:
    """Create the missing parent folders of output file `path` (the rule of `check_out_file`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """--threads and --no-progress, the same for every command that runs the models."""
    parser.add_argument(
        "--threads",
        type=int_in(1),
        default=None,
        help="torch CPU threads (default: $OMP_NUM_THREADS if set, else the free cores: "
        "cores - the 1-minute load average, at least 1)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
