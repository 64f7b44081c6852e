"""`mxattention theory`: table, exact boundaries, --json, --plot, plain-word errors with exit code 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mxattention.cli.main import main

SRC = Path(__file__).resolve().parents[2] / "src"


def test_theory_default_prints_table_and_boundaries(capsys):
    assert main(["theory"]) == 0
    out = capsys.readouterr().out
    assert "7.25" in out and "0.1926" in out
    assert "[4, 8)" in out and "(3, 6]" in out and "(3.625, 7.25]" in out
    assert "29/4" in out and "30 + sqrt(1/8192)" in out
    for name in ("e2m1", "e2m3", "e3m2", "e4m3", "e5m2"):
        assert name in out


def test_all_elems_prints_every_table(capsys):
    assert main(["theory", "--all-elems"]) == 0
    out = capsys.readouterr().out
    assert out.count("Shared-scale rules for") == 5


def test_json_written(tmp_path, capsys):
    path = tmp_path / "theory.json"
    assert main(["theory", "--elem", "E3M2", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["optimal_boundaries"]["e2m1"] == {"value": 7.25, "exact": "29/4", "stored": 7.25}
    rows = {r["rule"]: r for r in data["elems"]["e3m2"]["rules"]}
    assert rows["tfs"]["boundary"] == 28.0 and rows["ocp"]["normalized_max_range"]["text"] == "[16, 32)"
    assert str(path) in capsys.readouterr().out


def test_json_objective_grid_minimum_is_7_25(tmp_path):
    path = tmp_path / "t.json"
    assert main(["theory", "--json", str(path)]) == 0
    obj = json.loads(path.read_text())["elems"]["e2m1"]["objective"]
    assert obj["q"][0] == 6.0 and obj["q"][-1] == 8.0 and len(obj["q"]) == 41
    assert len(obj["densities"]) >= 3
    assert all(d["grid_argmin"] == 7.25 for d in obj["densities"].values())


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "fig2.png"
    assert main(["theory", "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


@pytest.mark.parametrize(
    "argv,message",
    [
        (["theory", "--elem", "e9m9"], "invalid choice: 'e9m9'"),
        (["theory", "--elem", "e2m1", "--all-elems"], "not allowed with"),
        (["theory", "--plot", "/dev/null/f.png"], "is a file"),
        (["theory", "--plot", "fig.jpg"], "must end in one of"),
        (["nonsense"], "invalid choice"),
        ([], "required"),
    ],
)
def test_bad_arguments_exit_2_with_message(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_help_exits_0(capsys):
    assert main(["--help"]) == 0
    assert "theory" in capsys.readouterr().out
    assert main(["theory", "--help"]) == 0
    assert "--all-elems" in capsys.readouterr().out


def test_python_dash_m_entry_point():
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(
        [sys.executable, "-m", "mxattention", "theory", "--elem", "nope"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 2
    assert "invalid choice" in proc.stderr and "Traceback" not in proc.stderr
