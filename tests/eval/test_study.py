"""The real-weights study runs end to end on a small slice and writes its tables."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("terrain_diffusion")
pytest.importorskip("skimage")

from mxattention.eval.study import run_study


def test_small_study(tmp_path):
    res = run_study(tmp_path, methods=["fp", "mxfp4-ocp", "mxattention"], n_texts=2, seeds=[0])
    assert (tmp_path / "study.md").read_text().startswith("# Study on real pretrained weights")
    saved = json.loads((tmp_path / "study.json").read_text())
    assert saved["terrain"]["heightmap_quality"]["mxattention"]["psnr_db"] > 20
    assert res["minilm"]["layer_rel_l2"]["fp"] == [0.0] * 6
    assert len(res["terrain"]["layer_rel_l2"]["mxattention"]) == 28
    assert all(e > 0 for e in res["terrain"]["layer_rel_l2"]["mxfp4-ocp"])
    assert 0.5 < res["minilm"]["rowsum"][0]["mean_row_sum"] < 1.0
