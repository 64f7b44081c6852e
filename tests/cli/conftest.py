"""Fixtures of the command-line tests."""

import pytest

import mxattention.eval.bench
import mxattention.eval.demo
import mxattention.eval.diagnostics


@pytest.fixture
def no_work(monkeypatch):
    """The work of demo, diagnose and bench fails the test if it starts: bad arguments and missing
    packages are found before it."""

    def forbidden(*_a, **_k):
        raise AssertionError("the command started its work before rejecting its arguments or packages")

    monkeypatch.setattr(mxattention.eval.demo, "run_demo", forbidden)
    monkeypatch.setattr(mxattention.eval.diagnostics, "rowsum_study", forbidden)
    monkeypatch.setattr(mxattention.eval.bench, "bench_methods", forbidden)
