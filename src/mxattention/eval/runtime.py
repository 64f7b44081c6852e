"""How the eval commands run on a shared machine: torch's thread count, progress, quiet imports.

- `choose_threads(requested)` -> (threads, why): an explicit request, else `OMP_NUM_THREADS`, else
  the free cores, max(1, cores - round(1-minute load average)), cores = this process's CPU affinity.
  Torch's default (one thread per core) oversubscribes a busy machine: the demo on 2 busy cores took
  274 s with 2 threads and 79 s with 1 (2026-12-01).
- `use_threads(requested)`: applies that choice to torch and prints it in one line (stderr).
- `progress(iterable, desc)`: a tqdm bar on stderr (one line per finished phase), or the plain
  iterable when progress is off.
- `process_start_time()`: when this process started (epoch seconds), so that a report's duration is
  the one a user measures around the command, imports included.
- `quiet_third_party_logs()`: drops the few import-time messages of optional packages that say
  nothing about this run (torchao's C-extension loads, its enum registrations, diffusers' note that
  torchao's tensor classes cannot be imported); every other message still shows.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def choose_threads(requested: int | None = None) -> tuple[int, str]:
    """(torch intra-op threads, the reason in words) for this machine right now."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"threads must be >= 1, got {requested}")
        return requested, "--threads"
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env), "OMP_NUM_THREADS"
    cores = _cores()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average (Windows)
        return cores, f"{cores} cores"
    free = max(1, min(cores, cores - round(load)))
    return free, f"{cores} cores, 1-minute load {load:.1f}"


def use_threads(requested: int | None = None, *, announce: bool = True) -> int:
    """Set torch's thread count by `choose_threads` and say so in one line on stderr; returns it."""
    import torch

    n, why = choose_threads(requested)
    torch.set_num_threads(n)
    if announce:
        print(f"torch threads: {n} ({why}; --threads N or OMP_NUM_THREADS=N sets it)", file=sys.stderr)
    return n


def process_start_time() -> float | None:
    """Wall-clock time (epoch seconds, `time.time()`'s clock) at which this process started, from
    /proc on Linux (10 ms resolution), or None where /proc is not there."""
    import time

    try:
        with open("/proc/self/stat") as f:  # field 22, after the ")" that closes the command name
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - started_ticks / os.sysconf("SC_CLK_TCK"))


def progress(items: Iterable[T], desc: str, *, enabled: bool = True, total: int | None = None) -> Iterator[T]:
    """`items` with a progress bar on stderr named `desc` (kept when done: one line per phase)."""
    if not enabled:
        yield from items
        return
    from tqdm.auto import tqdm

    yield from tqdm(items, desc=desc, total=total, file=sys.stderr, dynamic_ncols=True, leave=True)


class _DropMessages(logging.Filter):
    """Drops the records of one logger whose text contains one of `needles` (and, for the enum
    warnings, whose first argument is a class of `module`)."""

    def __init__(self, needles: tuple[str, ...], module: str | None = None) -> None:
        super().__init__()
        self.needles = needles
        self.module = module

    def filter(self, record: logging.LogRecord) -> bool:
        if self.module is not None:
            arg = record.args[0] if isinstance(record.args, tuple) and record.args else None
            if not str(getattr(arg, "__module__", "")).startswith(self.module):
                return True
        text = str(record.msg)
        return not any(n in text for n in self.needles)


_QUIET = (
    # torchao (a test-only dependency, imported by transformers / diffusers when installed): its
    # prebuilt C extensions for other torch / CUDA versions fail to load; nothing here uses them.
    ("torchao", _DropMessages(("Failed to load",))),
    # torch warns when torchao registers its enums as pytree constants (only torchao's enums).
    ("torch.utils._pytree", _DropMessages(("is an Enum subclass",), module="torchao")),
    # diffusers, when the installed torchao lacks tensor classes it lists for safe loading.
    ("diffusers.quantizers.torchao.torchao_quantizer", _DropMessages(("Unable to import `torchao`",))),
)


def quiet_third_party_logs() -> None:
    """Install the filters of `_QUIET` (idempotent); see the module docstring."""
    for name, filt in _QUIET:
        logger = logging.getLogger(name)
        if filt not in logger.filters:
            logger.addFilter(filt)
