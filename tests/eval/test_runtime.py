"""Thread choice on a shared machine, and the precise silencing of optional packages' import noise."""

from __future__ import annotations

import enum
import logging

import pytest
import torch

from mxattention.eval import runtime
from mxattention.eval.runtime import choose_threads, quiet_third_party_logs, use_threads


@pytest.fixture
def machine(monkeypatch):
    """A 2-core affinity and a settable 1-minute load average; no OMP_NUM_THREADS."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    load = {"now": 0.0}
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (load["now"], 0.0, 0.0))
    return load


@pytest.mark.parametrize("load,want", [(0.0, 2), (0.4, 2), (0.6, 1), (1.4, 1), (3.4, 1), (11.7, 1)])
def test_free_cores(machine, load, want):
    machine["now"] = load
    n, why = choose_threads()
    assert n == want and "2 cores" in why and f"{load:.1f}" in why


def test_env_and_explicit_win(machine, monkeypatch):
    machine["now"] = 5.0
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert choose_threads() == (3, "OMP_NUM_THREADS")
    assert choose_threads(2) == (2, "--threads")
    monkeypatch.setenv("OMP_NUM_THREADS", "lots")  # not a number: ignored, the load decides
    assert choose_threads()[0] == 1
    with pytest.raises(ValueError, match="threads"):
        choose_threads(0)


def test_use_threads_sets_torch_and_says_so(machine, capsys):
    before = torch.get_num_threads()
    try:
        machine["now"] = 1.0
        assert use_threads() == 1 and torch.get_num_threads() == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("torch threads: 1 (2 cores, 1-minute load 1.0")
    finally:
        torch.set_num_threads(before)


class _TorchaoEnum(enum.Enum):
    A = 1


_TorchaoEnum.__module__ = "torchao.quantization.quantize_.common"


class _OtherEnum(enum.Enum):
    A = 1


def test_quiet_drops_exactly_the_known_messages(caplog):
    quiet_third_party_logs()
    quiet_third_party_logs()  # idempotent
    caplog.set_level(logging.DEBUG)
    logging.getLogger("torchao").warning("Failed to load /x/torchao/_C_mxfp8.so: Could not load this library")
    logging.getLogger("torchao").warning(
        "Skipping import of cpp extensions due to incompatible torch version"
    )
    pytree = logging.getLogger("torch.utils._pytree")
    pytree.warning("%s is an Enum subclass and is now natively supported by torch.compile", _TorchaoEnum)
    pytree.warning("%s is an Enum subclass and is now natively supported by torch.compile", _OtherEnum)
    diff = logging.getLogger("diffusers.quantizers.torchao.torchao_quantizer")
    diff.warning("Unable to import `torchao` Tensor objects. This may affect loading checkpoints")
    diff.warning("something else about torchao")
    kept = [r.getMessage() for r in caplog.records]
    assert len(kept) == 3, kept
    assert (
        "Skipping import" in kept[0] and "_OtherEnum" in kept[1] and kept[2] == "something else about torchao"
    )
