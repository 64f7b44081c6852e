"""The study's summary table is its output: docs/results/study.json -> `results_table` ==
docs/results/readme_table.md (regenerate with `python -m mxattention.eval.study --render-only`).
The README's preset chooser cites this table (tests/test_readme.py)."""

from __future__ import annotations

import json
from pathlib import Path

from mxattention.eval.study import TABLE_FILE, results_table

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def test_summary_table_is_the_studys_output():
    res = json.loads((RESULTS / "study.json").read_text())
    table = (RESULTS / TABLE_FILE).read_text()
    assert results_table(res) == table, "readme_table.md is stale: rerun the study (or --render-only)"
    seeds = res["terrain"]["seeds"]
    assert f"{len(seeds)} paired seed(s): {', '.join(map(str, seeds))}" in table
