"""benchmarks/ab_trees.py: trees in alternating processes, their outputs compared bit for bit (here on
the CPU through Triton's interpreter, with a tiny call)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "ab_trees.py"
SRC = ROOT / "src"


def _run(args, tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(tmp_path), "--processes", "1"]
    cmd += ["--rounds", "1", "--round-ms", "0", "--timeout-s", "240", *args]  # args override the defaults
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def test_trees_compared_bit_for_bit(tmp_path):
    # A copy of the sources whose fused_attention perturbs its output: the report must say so.
    bent = tmp_path / "bent"
    shutil.copytree(SRC / "mxattention", bent / "mxattention", ignore=shutil.ignore_patterns("__pycache__"))
    with open(bent / "mxattention" / "kernels" / "fused.py", "a") as f:
        f.write(
            "\n_exact = fused_attention\n\n\ndef fused_attention(*a, **k):\n"
            "    r = _exact(*a, **k)\n    r.out.add_(1)\n    return r\n"
        )
    r = _run(
        [f"a={SRC}", f"b={SRC}", f"bent={bent}", "--shapes", "1x70x90x32", "--presets", "mxattention"],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "ab_trees.json").read_text())
    assert [len(report["runs"][n]) for n in ("a", "b", "bent")] == [1, 1, 1]
    (line,) = report["summary"]
    assert line.startswith("1x70x90x32/mxattention | a ")
    cells = dict(c.split(" ", 1) for c in line.split(" | ")[1:])
    assert "same bits True" in cells["a"] and "same bits True" in cells["b"]
    assert "same bits False" in cells["bent"]


def test_bad_tree_is_one_line_and_exit_2(tmp_path):
    r = _run([f"a={tmp_path}"], tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"ab_trees: tree a: {tmp_path} holds no mxattention package"]
    r = _run([str(SRC)], tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"ab_trees: tree {str(SRC)!r}: name=path expected"]
    r = _run([f"a={SRC}", "--shapes", "1x70xyx32"], tmp_path)
    assert r.returncode == 2 and "HxLqxLkxD (four positive integers)" in r.stderr


def test_a_process_past_its_timeout_is_reported(tmp_path):
    r = _run([f"a={SRC}", "--shapes", "1x70x90x32", "--timeout-s", "0.5"], tmp_path)
    assert r.returncode == 1
    assert "a: no result within --timeout-s 0.5" in r.stdout
    assert json.loads((tmp_path / "ab_trees.json").read_text())["runs"] == {"a": []}
