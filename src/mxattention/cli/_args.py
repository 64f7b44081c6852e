"""Argument checks shared by the subcommands: one wording for every command."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def check_methods(parser: argparse.ArgumentParser, methods: Sequence[str], extra: Sequence[str] = ()) -> None:
    """Exit with a usage error (code 2) naming every unknown method and the known ones."""
    from mxattention.attention.config import list_methods

    known = [*list_methods(), *extra]
    bad = [m for m in methods if m not in known]
    if bad:
        parser.error(f"unknown method(s) {', '.join(bad)}; choose from {', '.join(known)}")
