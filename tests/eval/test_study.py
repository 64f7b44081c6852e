"""run_study writes its tables, JSON and heightmaps from the two models' parts.

The parts are the stored full study's (docs/results/study.json): the real models run end to end once in
the suite, in tests/cli/test_cli_commands.py::test_demo_small, which also checks the study's numbers
and renders study.md and readme_table.md from that run. Here only run_study's own work is checked.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

import mxattention.eval.study as study

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def test_run_study_writes_its_outputs(tmp_path, monkeypatch):
    stored = json.loads((RESULTS / "study.json").read_text())
    maps = {"fp": torch.rand(2, 1, 8, 8), "mxattention": torch.rand(2, 1, 8, 8)}
    calls = []

    def minilm_part(methods, n_texts, *, show=True):
        calls.append(("minilm", list(methods), n_texts, show))
        return {**copy.deepcopy(stored["minilm"]), "_rowsum_studies": ["minilm studies"]}

    def terrain_part(methods, seeds, *, show=True):
        calls.append(("terrain", list(methods), list(seeds), show))
        return {**copy.deepcopy(stored["terrain"]), "_maps": maps, "_rowsum_studies": ["terrain studies"]}

    monkeypatch.setattr(study, "minilm_part", minilm_part)
    monkeypatch.setattr(study, "terrain_part", terrain_part)
    res = study.run_study(
        tmp_path,
        methods=["fp", "mxattention"],
        n_texts=3,
        seeds=[5],
        argv=["--texts", "3"],
        show_progress=False,
    )
    assert calls == [
        ("minilm", ["fp", "mxattention"], 3, False),
        ("terrain", ["fp", "mxattention"], [5], False),
    ]
    assert res["meta"]["command"] == "python -m mxattention.eval.study --texts 3"
    assert res["meta"]["seconds"] >= 0 and res["meta"]["threads"] == torch.get_num_threads()
    # The private parts come back in the result, not in the JSON.
    assert res["terrain"]["_maps"] is maps and res["minilm"]["_rowsum_studies"] == ["minilm studies"]
    saved = json.loads((tmp_path / "study.json").read_text())
    assert saved["terrain"] == stored["terrain"] and saved["minilm"] == stored["minilm"]
    assert saved["meta"]["command"] == res["meta"]["command"]
    loaded = torch.load(tmp_path / "study_heightmaps.pt")
    assert loaded.keys() == maps.keys() and all(torch.equal(loaded[m], maps[m]) for m in maps)
    md = (tmp_path / "study.md").read_text()
    assert md.startswith("# Study on real pretrained weights") and md == study.render_markdown(saved)
    table = (tmp_path / study.TABLE_FILE).read_text()
    assert table == study.results_table(saved) and "study --texts 3`" in table
    assert "4 paired seed(s): 0, 1, 2, 3" in table and "| **mxattention** (Hadamard + UOS + PNQ) |" in table
