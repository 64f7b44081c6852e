"""The real-weights study runs end to end on a small slice and writes its tables."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("terrain_diffusion")
pytest.importorskip("skimage")

from mxattention.eval.study import run_study


def test_small_study(tmp_path, monkeypatch):
    import functools

    import torch

    import mxattention.eval.study as study

    # A 6-point global-scaling grid instead of 101: the row-sum study is most of the run's time.
    grid = torch.linspace(1.0, 1.5, 6)
    monkeypatch.setattr(study, "rowsum_study", functools.partial(study.rowsum_study, global_grid=grid))
    res = run_study(
        tmp_path, methods=["fp", "mxfp4-ocp", "mxattention"], n_texts=2, seeds=[0], show_progress=False
    )
    assert (tmp_path / "study.md").read_text().startswith("# Study on real pretrained weights")
    saved = json.loads((tmp_path / "study.json").read_text())
    assert saved["terrain"]["heightmap_quality"]["mxattention"]["psnr_db"] > 20
    assert res["minilm"]["layer_rel_l2"]["fp"] == [0.0] * 6
    assert len(res["terrain"]["layer_rel_l2"]["mxattention"]) == 28
    assert all(e > 0 for e in res["terrain"]["layer_rel_l2"]["mxfp4-ocp"])
    assert 0.5 < res["minilm"]["rowsum"][0]["mean_row_sum"] < 1.0
    table = (tmp_path / "readme_table.md").read_text()
    assert "1 paired seed(s): 0" in table and "| **mxattention** (Hadamard + UOS + PNQ) |" in table
    assert res["terrain"]["attention_calls"]["mxfp4-ocp"]["routed"] == 28
