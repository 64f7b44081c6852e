"""Configs: every field checked at construction (naming the field), every accepted form round-trips."""

from __future__ import annotations

import json

import pytest
import torch

import mxattention as mx
from mxattention.attention.config import FORMATS, MX_FORMATS, PRESETS, AttentionConfig, QuantSpec
from mxattention.formats import LADDERS, ScaleMode, ScaleRule, fake_quantize
from mxattention.theory import optimal_boundary


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"format": 4}, TypeError, "QuantSpec.format must be a str"),
        ({"format": "mxfp8"}, ValueError, "QuantSpec.format must be one of"),
        ({"format": "nvfp4", "two_level": "no"}, TypeError, "QuantSpec.two_level must be a bool"),
        ({"two_level": 1}, TypeError, "QuantSpec.two_level must be a bool"),
        ({"rule": True}, TypeError, "QuantSpec.rule must be"),
        ({"rule": None}, TypeError, "QuantSpec.rule must be"),
        ({"rule": "floor"}, ValueError, "QuantSpec.rule: rule must be one of"),
        ({"rule": float("nan")}, ValueError, "QuantSpec.rule: .*finite"),
    ],
)
def test_quant_spec_checks_every_field(kwargs, error, match):
    with pytest.raises(error, match=match):
        QuantSpec(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"name": 5}, TypeError, "AttentionConfig.name must be a str"),
        ({"name": ""}, ValueError, "AttentionConfig.name must be a non-empty"),
        ({"notes": None}, TypeError, "AttentionConfig.notes must be a str"),
        ({"q": "mxfp4"}, TypeError, "AttentionConfig.q must be a QuantSpec"),
        ({"p": {"format": "mxfp4"}}, TypeError, "AttentionConfig.p must be a QuantSpec"),
        ({"hadamard": "yes"}, TypeError, "AttentionConfig.hadamard must be a bool"),
        ({"pnq": None}, TypeError, "AttentionConfig.pnq must be a bool"),
        ({"smooth_k": 1}, TypeError, "AttentionConfig.smooth_k must be a bool"),
        ({"smooth_q": "False"}, TypeError, "AttentionConfig.smooth_q must be a bool"),
        ({"smooth_q_block": 0}, ValueError, "AttentionConfig.smooth_q_block must be a positive int"),
        ({"block_m": 64.0}, TypeError, "AttentionConfig.block_m must be a positive int"),
        ({"block_n": True}, TypeError, "AttentionConfig.block_n must be a positive int"),
        ({"block_n": 48}, ValueError, "AttentionConfig.block_n must be a multiple of 32"),
        ({"p_row_scale": "1"}, TypeError, "AttentionConfig.p_row_scale must be a float"),
        ({"p_row_scale": -2.0}, ValueError, "AttentionConfig.p_row_scale must be a finite float > 0"),
    ],
)
def test_attention_config_checks_every_field(kwargs, error, match):
    with pytest.raises(error, match=match):
        AttentionConfig(**kwargs)


_RULE_FORMS = [
    "ocp",
    "TFS",
    "uos",
    7,
    7.3,
    ScaleRule("mine", ScaleMode.CEIL, 6.5),
    ScaleRule("f", ScaleMode.FLOOR),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rule", _RULE_FORMS, ids=str)
def test_every_accepted_spec_round_trips_through_json(fmt, rule):
    # E2M1's boundaries (7, 7.3, 6.5) moved to the format's ladder (its max / 6 times them): a
    # boundary must lie in (max / 2, 2 max) (test_boundary_must_lie_where_the_rule_means_something).
    top = LADDERS[MX_FORMATS.get(fmt, "e2m1")].max_value
    if isinstance(rule, (int, float)):
        rule = rule * top / 6.0
    elif isinstance(rule, ScaleRule) and rule.mode is ScaleMode.CEIL:
        rule = ScaleRule(rule.name, rule.mode, rule.boundary * top / 6.0)
    spec = QuantSpec(fmt, rule)
    cfg = AttentionConfig("t", spec, spec, spec, spec, pnq=True, p_row_scale=2)
    back = AttentionConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg and back.q.rule == spec.rule


def test_presets_round_trip_and_spellings_normalize():
    for cfg in PRESETS.values():
        assert AttentionConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert QuantSpec("mxfp4", "UOS") == QuantSpec("mxfp4", "uos")
    assert QuantSpec("mxfp4", 7).rule == 7.0
    with pytest.raises(ValueError, match="unknown field"):
        AttentionConfig.from_dict({"name": "x", "hadamrd": True})
    with pytest.raises(ValueError, match="mode must be one of"):
        QuantSpec.from_dict({"rule": {"name": "x", "mode": "round", "boundary": 7.0}})


def test_scale_rule_spec_runs_as_its_float_boundary():
    """Defect 4 of issue 18: a ScaleRule in a QuantSpec reached json.dumps in the public function."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 32, generator=g) for _ in range(3))

    def run(rule):
        s = QuantSpec("mxfp4", rule)
        return mx.scaled_dot_product_attention(q, k, v, method=AttentionConfig("r", s, s, s, s, pnq=True))

    assert torch.equal(run(ScaleRule("mine", ScaleMode.CEIL, 7.25)), run(7.25))


@pytest.mark.parametrize("fmt", MX_FORMATS)
def test_mx_formats_quantize_on_their_ladder_with_its_boundary(fmt):
    spec = QuantSpec.mx(MX_FORMATS[fmt])
    assert spec == QuantSpec(fmt) and spec.ladder is LADDERS[MX_FORMATS[fmt]]
    assert spec.scale_rule.boundary == optimal_boundary(spec.elem)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1)) * 3
    from mxattention.attention.operands import quantize

    assert torch.equal(quantize(x, spec, -1), fake_quantize(x, -1, rule="uos", elem=spec.elem))


@pytest.mark.parametrize(
    ("fmt", "low", "high"),
    [
        ("mxfp4", 3.0, 12.0),
        ("mxfp6_e2m3", 3.75, 15.0),
        ("mxfp8_e4m3", 224.0, 896.0),
        ("mxfp8_e5m2", 28672.0, 114688.0),
    ],
)
def test_boundary_must_lie_where_the_rule_means_something(fmt, low, high):
    """A ceil boundary q normalizes each block maximum into (q/2, q]: q <= max/2 leaves the ladder's
    top binade unused (2q is never worse: E2M1 q = 1e-3 zeroed every element), q >= 2 max puts every
    block maximum past the ladder's max (q = 1e6 saturated every element). Both are refused, naming
    the rule and the range; the open interval between is accepted, as a float or a ScaleRule."""
    for q in (1e-3, low, high, 1e6):
        for rule in (q, ScaleRule("mine", ScaleMode.CEIL, q)):
            with pytest.raises(ValueError, match=rf"QuantSpec.rule: .*\({low:g}, {high:g}\)"):
                QuantSpec(fmt, rule)
    for q in (low * 1.0001, high * 0.9999):
        assert QuantSpec(fmt, q).scale_rule.boundary == q
    assert QuantSpec("nvfp4", 1e-3).rule == 1e-3  # NVFP4 ignores the rule
