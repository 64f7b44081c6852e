"""The command-line cases of issue 27: each is one line (an error on stderr, exit 2, before any work or
output; or the right output), never a traceback."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import pytest
import torch

import mxattention.cli.theory
import mxattention.eval.bench
import mxattention.eval.demo
import mxattention.eval.diagnostics
from mxattention._callsite import warn_at_call_site
from mxattention.cli import _args
from mxattention.cli.main import main


def _error_line(capsys, *words: str) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert ": error: " in lines[0] and all(w in lines[0] for w in words), lines[0]
    assert captured.out == ""  # checked before anything is printed
    return lines[0]


def test_diagnose_head_dim_no_method_serves(tmp_path, no_work, capsys):
    """A valid file whose head dim (20) the Hadamard of mxattention cannot rotate: one line naming it."""
    z = torch.zeros(1, 2, 8, 20)
    torch.save({"q": z, "k": z, "v": z}, tmp_path / "d20.pt")
    assert main(["diagnose", "--tensors", str(tmp_path / "d20.pt"), "--no-progress"]) == 2
    _error_line(capsys, "--tensors", "mxattention cannot serve head dim 20")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize(
    "argv,option",
    [(["theory", "--json", "/proc/nowhere/y.json"], "--json"), (["demo", "--out", "/proc/nowhere"], "--out")],
    ids=["theory-json", "demo-out"],
)
def test_unwritable_output_is_found_before_any_output(argv, option, no_work, capsys):
    """/proc takes no new folder even for root (for whom os.access says yes)."""
    from mxattention.cli import _requires
    from mxattention.cli.demo import needed_modules

    if argv[0] == "demo" and _requires.missing_modules(needed_modules(argparse.Namespace(no_progress=True))):
        pytest.skip("the demo's packages are not installed (that check comes first)")
    assert main([*argv, "--no-progress"] if argv[0] == "demo" else argv) == 2
    _error_line(capsys, option, "/proc/nowhere", "cannot write")


@pytest.mark.parametrize("value", ["100", "2.9", "3", "12", "12.5"])
def test_rule_outside_the_meaningful_range_is_refused(value, no_work, capsys):
    """The CLI's range is QuantSpec's (`boundary_reason`): open at both ends."""
    assert main(["diagnose", "--model", "minilm", "--rule", value]) == 2
    _error_line(capsys, "--rule", value, "strictly between 3 and 12")


def test_rule_inside_the_range_and_names_are_accepted():
    assert [_args.rule(t) for t in ("3.01", "7.25", "11.99", "UOS")] == [3.01, 7.25, 11.99, "uos"]


def test_bench_on_cpu_prints_the_path_that_runs(capsys):
    argv = ["bench", "--device", "cpu", "--plan", "--shape", "1", "1", "32", "32", "--repeat", "1"]
    assert main([*argv, "--methods", "mxattention", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "plan of mxattention: PyTorch reference (" in out
    assert "tiles:" not in out and "forward:" not in out  # no GPU kernel plan for a call that does not use it
    assert "GFLOP/s" in out and "TFLOP/s" not in out


def test_warnings_during_a_command_are_one_plain_line(monkeypatch, capsys):
    """A library warning is printed as `mxattention: warning: ...` without the file:line it was
    attributed to (for the console script, `.venv/bin/mxattention:6`), and the hook ends with main."""
    original = mxattention.cli.theory.rule_table
    public = dict(vars(warnings))
    changed = []

    def warning_table(elem):
        warn_at_call_site("mxattention: a warning\n  on two lines", UserWarning)
        # The public functions of `warnings` stay as they are (MiniLM's sentences come from their docs).
        changed.extend(
            k
            for k, v in vars(warnings).items()
            if not k.startswith("_") and callable(v) and public.get(k) is not v
        )
        return original(elem)

    monkeypatch.setattr(mxattention.cli.theory, "rule_table", warning_table)
    before = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["theory"]) == 0
    err = capsys.readouterr().err
    assert err == "mxattention: warning: a warning on two lines (UserWarning)\n"
    assert warnings.showwarning is before and changed == []
