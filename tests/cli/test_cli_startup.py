"""`mxattention --help` and `--version` import neither torch nor any subcommand; a subcommand's --help
imports its own module only, not Triton, torch._dynamo, matplotlib or the models (issue 27).

Each case is one fresh interpreter (the test process has imported everything already)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
HEAVY = ("torch", "numpy", "triton", "torch._dynamo", "matplotlib", "diffusers", "transformers")


def _child(code: str) -> dict:
    """Run `code` in a fresh interpreter that sees this checkout; it prints one JSON line last."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_help_and_version_load_nothing_heavy():
    got = _child(
        "import io, json, sys, time, contextlib\n"
        "from mxattention.cli.main import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    codes = [main(['--version']), main(['--help'])]\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(json.dumps({'codes': codes, 'out': buf.getvalue(), 'heavy': heavy, 'cpu': time.process_time()}))\n"
    )
    from mxattention import __version__

    assert got["codes"] == [0, 0]
    assert got["out"].startswith(f"mxattention {__version__}\n") and "demo" in got["out"]
    assert got["heavy"] == []
    assert got["cpu"] < 1.0  # CPU seconds of the whole child, interpreter start included (~0.1 s)


def test_subcommand_help_skips_triton_dynamo_and_plots():
    got = _child(
        "import io, json, sys, contextlib\n"
        "from mxattention.cli.main import COMMANDS, main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    codes = [main([c, '--help']) for c in COMMANDS]\n"
        "heavy = [m for m in ('triton', 'torch._dynamo', 'matplotlib', 'diffusers', 'transformers',\n"
        "         'terrain_diffusion', 'mxattention.kernels', 'mxattention.eval.study') if m in sys.modules]\n"
        "print(json.dumps({'codes': codes, 'heavy': heavy}))\n"
    )
    assert set(got["codes"]) == {0} and got["heavy"] == []
