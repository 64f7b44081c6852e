"""benchmarks/ab_trees.py: trees in alternating processes, their outputs compared bit for bit (here on
the CPU through Triton's interpreter, with a tiny call). The script's parent runs in this process
(its `main`); only the trees' children are fresh processes, the fewest that show the property."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "ab_trees.py"
SRC = ROOT / "src"


@pytest.fixture(scope="module")
def ab_trees():
    """The script as a module (its `__file__` is the script, which its children run)."""
    spec = importlib.util.spec_from_file_location("ab_trees", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(ab_trees, args, tmp_path, monkeypatch) -> int:
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the children's kernels run in the interpreter
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script adds benchmarks/ for its shapes
    argv = ["--device", "cpu", "--out", str(tmp_path), "--processes", "1"]
    argv += ["--rounds", "1", "--round-ms", "0", "--timeout-s", "240", *args]  # args override the defaults
    return ab_trees.main(argv)


def test_trees_compared_bit_for_bit(ab_trees, tmp_path, monkeypatch, capsys):
    # A copy of the sources whose fused_attention perturbs its output: the report must say so. Three
    # children: a and b (the same tree in two processes: same bits) and the perturbed copy.
    bent = tmp_path / "bent"
    shutil.copytree(SRC / "mxattention", bent / "mxattention", ignore=shutil.ignore_patterns("__pycache__"))
    with open(bent / "mxattention" / "kernels" / "fused.py", "a") as f:
        f.write(
            "\n_exact = fused_attention\n\n\ndef fused_attention(*a, **k):\n"
            "    r = _exact(*a, **k)\n    r.out.add_(1)\n    return r\n"
        )
    rc = _run(
        ab_trees,
        [f"a={SRC}", f"b={SRC}", f"bent={bent}", "--shapes", "1x70x90x32", "--presets", "mxattention"],
        tmp_path,
        monkeypatch,
    )
    assert rc == 0, capsys.readouterr().out[-3000:]
    report = json.loads((tmp_path / "ab_trees.json").read_text())
    assert [len(report["runs"][n]) for n in ("a", "b", "bent")] == [1, 1, 1]
    (line,) = report["summary"]
    assert line.startswith("1x70x90x32/mxattention | a ")
    assert capsys.readouterr().out.splitlines() == [line]
    cells = dict(c.split(" ", 1) for c in line.split(" | ")[1:])
    assert "same bits True" in cells["a"] and "same bits True" in cells["b"]
    assert "same bits False" in cells["bent"]


def test_bad_tree_is_one_line_and_exit_2(ab_trees, tmp_path, monkeypatch, capsys):
    """Bad arguments: exit status 2 (`sys.exit(main())`), one line on stderr, no child started."""
    assert _run(ab_trees, [f"a={tmp_path}"], tmp_path, monkeypatch) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"ab_trees: tree a: {tmp_path} holds no mxattention package"]
    assert _run(ab_trees, [str(SRC)], tmp_path, monkeypatch) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"ab_trees: tree {str(SRC)!r}: name=path expected"
    ]
    assert _run(ab_trees, [f"a={SRC}", "--shapes", "1x70xyx32"], tmp_path, monkeypatch) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "HxLqxLkxD (four positive integers)" in err
    assert not (tmp_path / "ab_trees.json").exists()


def test_a_process_past_its_timeout_is_reported(ab_trees, tmp_path, monkeypatch, capsys):
    # The child is killed while it still imports torch: 0.5 s of its CPU, no kernel run.
    assert (
        _run(ab_trees, [f"a={SRC}", "--shapes", "1x70x90x32", "--timeout-s", "0.5"], tmp_path, monkeypatch)
        == 1
    )
    assert "a: no result within --timeout-s 0.5" in capsys.readouterr().out
    assert json.loads((tmp_path / "ab_trees.json").read_text())["runs"] == {"a": []}
