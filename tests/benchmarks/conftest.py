"""Tests of the scripts under benchmarks/ (investigations, not the package): they import as top-level
modules from that folder."""

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
