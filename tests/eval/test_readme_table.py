"""One source of truth for the README's results table: the study writes it, the README copies it.

docs/results/study.json -> `results_table` == docs/results/readme_table.md == the README's marked block.
Regenerate all three with `python -m mxattention.eval.study --readme README.md` (or, without
rerunning the models, `--render-only --readme README.md`).
"""

from __future__ import annotations

import json
from pathlib import Path

from mxattention.eval.study import README_BEGIN, README_END, TABLE_FILE, results_table, update_readme

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"


def test_readme_table_is_the_studys_output():
    res = json.loads((RESULTS / "study.json").read_text())
    table = (RESULTS / TABLE_FILE).read_text()
    assert results_table(res) == table, "readme_table.md is stale: rerun the study (or --render-only)"
    readme = (ROOT / "README.md").read_text()
    assert readme.count(README_BEGIN) == 1 and readme.count(README_END) == 1
    block = readme.split(README_BEGIN)[1].split(README_END)[0]
    assert block.strip() == table.strip(), (
        "README's table differs: python -m mxattention.eval.study --render-only --readme README.md"
    )
    seeds = res["terrain"]["seeds"]
    assert f"{len(seeds)} paired seed(s): {', '.join(map(str, seeds))}" in table


def test_update_readme_replaces_only_the_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{README_BEGIN}\nold\n{README_END}\nafter\n")
    update_readme(readme, "| new |\n")
    assert readme.read_text() == f"before\n{README_BEGIN}\n| new |\n{README_END}\nafter\n"
