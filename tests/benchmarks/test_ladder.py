"""The precision-ladder study: its configurations, the q sweep per ladder, the report (models stubbed)."""

from __future__ import annotations

import dataclasses
import functools
import json

import ladder
import torch

from mxattention.attention.config import PRESETS
from mxattention.eval.models.qkv import LayerQKV


def test_each_ablation_changes_one_piece():
    base = {f.name: f for f in dataclasses.fields(PRESETS["mxattention"])}
    for name, cfg in ladder.ABLATIONS.items():
        assert name not in PRESETS
        if name == "mxfp8-ocp-direct":
            continue
        parent = min(
            (p for p in PRESETS.values()),
            key=lambda p: sum(getattr(p, f) != getattr(cfg, f) for f in base if f not in ("name", "notes")),
        )
        changed = {f for f in base if f not in ("name", "notes") and getattr(parent, f) != getattr(cfg, f)}
        assert 1 <= len(changed) <= 3, (name, parent.name, changed)  # v and p move together


def _layer(seed: int) -> LayerQKV:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(1, 2, 64, 32, generator=g) * torch.exp(torch.randn(32, generator=g)) for _ in range(3)
    )
    return LayerQKV(f"layer{seed}", q, k, v)


def test_sweeps_find_the_flat_stretch_of_e4m3_ending_at_its_boundary():
    sw = ladder.ladder_sweeps([_layer(0), _layer(1)])
    assert set(sw) == {"e2m1", "e2m3", "e3m2", "e4m3", "e5m2"}
    e4m3 = sw["e4m3"]
    assert e4m3["nearest_grid_q"] == 464.0
    for t in ("Q", "K", "V"):
        row = e4m3["tensors"][t]
        assert row["offset_steps"] == [0, 0]  # q* is a point of least MSE on every tensor
        # Ties run from the max up to q* (a step or two past it where no block max lies in between).
        assert all(lo == 448.0 and 464.0 <= hi <= 470.0 for lo, hi in row["best_q"])
        assert all(r >= 0 for r in row["rise_one_step_above"])


def test_report_from_stubbed_models(tmp_path, monkeypatch):
    layers = [_layer(0)]

    def fake(methods, *_):
        q = {m: {"psnr_db": 50.0, "ssim": 0.99, "psnr_per_seed": [50.0]} for m in methods}
        e = {m: 0.1 for m in methods}
        return {"seeds": [0], "quality": q, "layer_rel_l2": e}, layers

    def fake_minilm(methods, n):
        return {
            "texts": n,
            "embedding_cosine": {m: 0.99 for m in methods},
            "layer_rel_l2": {m: 0.1 for m in methods},
        }, layers

    monkeypatch.setattr(ladder, "terrain", fake)
    monkeypatch.setattr(ladder, "minilm", fake_minilm)
    monkeypatch.setattr(
        ladder, "dit_like_qkv", functools.partial(ladder.dit_like_qkv, h=1, lq=40, lk=72, d=64)
    )
    methods = ["fp", "mxattention", "mxattention-pv8", "mxattention-pv8-smooth", "nvfp4-sage", "pv8-smooth-k"]
    res = ladder.run(tmp_path, n_texts=2, seeds=[0], methods=methods)
    md = (tmp_path / "ladder.md").read_text()
    assert "Targets (issue 16)" in md and "`pv8-smooth-k`" in md and "| e4m3 | 464 |" in md
    saved = json.loads((tmp_path / "ladder.json").read_text())
    assert saved["dit_like"]["rel_l2"]["fp"] == 0.0 and res["dit_like"]["rel_l2"]["mxattention"] > 0
    assert saved["configs"]["pv8-smooth-k"]["smooth_k"] is True


def test_dit_like_has_outliers_and_offsets():
    q, k, _ = ladder.dit_like_qkv(0, h=2, lq=300, lk=300, d=128)
    assert q.shape == (1, 2, 300, 128)
    ch_scale = k.std(dim=-2).amax(dim=-1) / k.std(dim=-2).median(dim=-1).values
    assert (ch_scale > 3).all()  # outlier channels
    assert (k.mean(dim=-2).abs().amax(dim=-1) > 1).all()  # per-channel offsets


def test_report_gives_the_standard_error_of_paired_seeds(tmp_path, monkeypatch):
    # pv8 - mxattention per seed: +1, +5, +3, +7 dB -> mean +4, sd sqrt(20/3), SE 1.29.
    per_seed = {"mxattention": [40.0, 40.0, 40.0, 40.0], "mxattention-pv8": [41.0, 45.0, 43.0, 47.0]}

    def fake(methods, seeds):
        q = {}
        for m in methods:
            ps = per_seed.get(m, [float("inf")] * 4 if m == "fp" else [50.0] * 4)
            q[m] = {"psnr_db": sum(ps) / 4, "ssim": 0.99, "psnr_per_seed": ps}
        return {"seeds": list(seeds), "quality": q, "layer_rel_l2": {m: 0.1 for m in methods}}, [_layer(0)]

    def fake_minilm(methods, n):
        return {
            "texts": n,
            "embedding_cosine": {m: 0.99 for m in methods},
            "layer_rel_l2": {m: 0.1 for m in methods},
        }, []

    monkeypatch.setattr(ladder, "terrain", fake)
    monkeypatch.setattr(ladder, "minilm", fake_minilm)
    monkeypatch.setattr(
        ladder, "dit_like_qkv", functools.partial(ladder.dit_like_qkv, h=1, lq=40, lk=72, d=64)
    )
    methods = ["fp", "mxattention", "mxattention-pv8", "mxattention-pv8-smooth", "nvfp4-sage"]
    ladder.run(tmp_path, n_texts=2, seeds=[0, 1, 2, 3], methods=methods)
    md = (tmp_path / "ladder.md").read_text()
    assert "| +4.00 +- 1.29 (+1.0, +5.0, +3.0, +7.0) |" in md  # the pieces table
    assert "on terrain: +4.00 +- 1.29 dB (target >= +6 dB)" in md
    assert "on terrain: +0.00 +- 0.00 dB (target >= -2 dB)" in md  # equal per seed: no spread
