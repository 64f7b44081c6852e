"""PrecisionPolicy: rules, step tracking, layer / kind detection, and exactness of what it keeps."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from mxattention.integrations import AttentionSite, PrecisionPolicy
from tests.integrations import tiny_models
from tests.integrations.tiny_models import rel_l2

BACKEND = "mxattention_policy_test"


def test_rules_describe_and_validation():
    policy = PrecisionPolicy.wan22()
    assert policy.layers == {0} and policy.steps == {38, 39}
    assert "blocks 0" in policy.describe() and "steps 38-39" in policy.describe()
    assert policy.keeps(AttentionSite("blocks.0.attn1", 0), 5, "self")
    assert policy.keeps(AttentionSite("blocks.7.attn2", 7), 39, "cross")
    assert not policy.keeps(AttentionSite("blocks.7.attn2", 7), 37, "cross")
    assert not policy.keeps(None, None, "self")
    assert PrecisionPolicy(modules=("blocks.*.attn2",)).keeps(AttentionSite("blocks.3.attn2", 3), 0, "self")
    assert PrecisionPolicy(kinds={"cross"}).keeps(None, None, "cross")
    assert "steps 0-2, 5" in PrecisionPolicy(steps=[5, 0, 1, 2]).describe()
    for bad in ({"kinds": {"joint"}}, {"kinds": "self"}, {"steps": {-1}}, {"layers": {True}}):
        with pytest.raises(ValueError):
            PrecisionPolicy(**bad)
    with pytest.raises(ValueError, match="no quantized operand"):
        PrecisionPolicy(high_precision="mxattention")
    with pytest.raises(TypeError):
        PrecisionPolicy(modules="blocks.0.*")
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.layers = frozenset()  # type: ignore[misc]
    assert dataclasses.replace(policy) == policy
    assert dataclasses.replace(policy)._state is not policy._state
    assert PrecisionPolicy(high_precision="fp").high_precision_method.name == "fp"


class TimestepModel(nn.Module):
    """Stands in for a transformer: only its timestep input matters to the step tracker."""

    def forward(self, hidden_states: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        return hidden_states


def test_step_tracking_from_timesteps():
    policy, model, x = PrecisionPolicy(), TimestepModel(), torch.zeros(1)
    policy.attach(model)
    seen = []
    for t in (999.0, 999.0, 800.0, 800.0, 500.0):  # classifier-free guidance as two calls
        model(x, torch.tensor([t]))
        seen.append(policy.step)
    model(x, timestep=torch.tensor([300.0, 300.0]))  # batched CFG, passed by keyword
    seen.append(policy.step)
    model(x, torch.tensor([[0.0, 200.0, 200.0]]))  # Wan2.2 TI2V: per-token t, first frame at 0
    seen.append(policy.step)
    model(x, torch.tensor([999.0]))  # t back up: a new generation
    seen.append(policy.step)
    assert seen == [0, 0, 1, 1, 2, 3, 4, 0]
    assert policy.counts()["runs"] == 2 and policy.counts()["model_calls"] == 8
    policy.reset()
    assert policy.step is None and policy.counts()["model_calls"] == 0


def test_step_callback_owns_the_count():
    # A Heun-like sampler evaluates the model at two t per step: only the callback knows the step.
    policy, model, x = PrecisionPolicy(), TimestepModel(), torch.zeros(1)
    pipe = SimpleNamespace(num_timesteps=3)
    with policy.attach(model, steps="callback"):
        seen = []
        for run in range(2):
            for i in range(3):
                for t in (900.0 - 300 * i, 750.0 - 300 * i):
                    model(x, torch.tensor([t]))
                    seen.append(policy.step)
                assert policy.step_callback(pipe, i, None, {"latents": run}) == {"latents": run}
        assert seen == [0, 0, 1, 1, 2, 2] * 2
        assert policy.counts()["runs"] == 3  # the third has just been set up at step 0
    model(x, torch.tensor([0.0]))
    assert policy.counts()["model_calls"] == 12  # hooks removed by leaving the handle


@pytest.fixture(scope="module")
def register():
    pytest.importorskip("diffusers")
    from mxattention.integrations import register_diffusers_backend

    return lambda method, policy: register_diffusers_backend(method, name=BACKEND, policy=policy)


def _denoise(model, register, policy, steps=(999.0, 750.0, 500.0, 250.0), method="mxattention"):
    """Wan-pipeline-like loop: per step, a conditional and an unconditional call with the same t.

    Returns per step the outputs of block 0 and of the model (conditional call)."""
    from diffusers.models.attention_dispatch import attention_backend

    backend = register(method, policy) if policy is not None or method != "native" else "native"
    block0, outs = [], []
    hook = model.blocks[0].register_forward_hook(lambda m, a, o: block0.append(o))
    handle = policy.attach(model) if policy is not None else None
    try:
        with torch.no_grad(), attention_backend(backend):
            for t in steps:
                cond = model(**tiny_models.wan_inputs(t=t))[0]
                model(**tiny_models.wan_inputs(seed=2, t=t))
                outs.append(cond)
    finally:
        hook.remove()
        if handle is not None:
            handle.remove()
    return block0[::2], outs


@pytest.fixture(scope="module")
def wan_native(register):
    model = tiny_models.wan()
    return model, _denoise(model, register, None, method="native")


def test_block0_and_final_step_stay_exact(wan_native, register):
    model, (native_block0, native_out) = wan_native
    policy = PrecisionPolicy(layers={0}, steps={3})
    block0, out = _denoise(model, register, policy)
    for step in range(4):
        assert torch.equal(block0[step], native_block0[step])
    assert torch.equal(out[3], native_out[3])
    for step in range(3):
        assert 0 < rel_l2(out[step], native_out[step]) < 0.1
    c = policy.counts()
    # Per step: 2 model calls x (block 0, block 1) x (self, cross).
    assert c["by_step"] == {
        0: {"quantized": 4, "high_precision": 4},
        1: {"quantized": 4, "high_precision": 4},
        2: {"quantized": 4, "high_precision": 4},
        3: {"quantized": 0, "high_precision": 8},
    }
    assert c["by_layer"] == {
        0: {"quantized": 0, "high_precision": 16},
        1: {"quantized": 12, "high_precision": 4},
    }
    assert c["by_kind"] == {
        "cross": {"quantized": 6, "high_precision": 10},
        "self": {"quantized": 6, "high_precision": 10},
    }
    report = policy.report()
    assert "12 quantized, 20 high precision" in report and "model calls 8" in report


def test_keeping_everything_reproduces_native_and_fp(wan_native, register):
    model, (_, native_out) = wan_native
    keep_all = PrecisionPolicy(kinds={"self", "cross"})
    _, out = _denoise(model, register, keep_all)
    assert all(torch.equal(a, b) for a, b in zip(out, native_out, strict=True))
    assert keep_all.counts()["quantized"] == 0 and keep_all.counts()["high_precision"] == 32
    _, fp = _denoise(model, register, None, method="fp")
    _, kept_fp = _denoise(model, register, PrecisionPolicy(kinds={"self", "cross"}, high_precision="fp"))
    assert all(torch.equal(a, b) for a, b in zip(kept_fp, fp, strict=True))
    # Keeping nothing is the plain quantized method.
    _, mx = _denoise(model, register, None)
    _, none_kept = _denoise(model, register, PrecisionPolicy())
    assert all(torch.equal(a, b) for a, b in zip(none_kept, mx, strict=True))


def test_kinds_and_module_patterns_on_wan(wan_native, register):
    model, _ = wan_native
    cross = PrecisionPolicy(kinds={"cross"})  # from WanAttention.is_cross_attention
    _denoise(model, register, cross, steps=(999.0,))
    assert cross.counts()["by_kind"] == {
        "cross": {"quantized": 0, "high_precision": 4},
        "self": {"quantized": 4, "high_precision": 0},
    }
    one = PrecisionPolicy(modules=("blocks.1.attn1",))
    _denoise(model, register, one, steps=(999.0,))
    assert one.counts()["by_layer"] == {
        0: {"quantized": 4, "high_precision": 0},
        1: {"quantized": 2, "high_precision": 2},
    }


def test_flux_blocks_are_numbered_across_both_block_lists(register):
    from diffusers.models.attention_dispatch import attention_backend

    model = tiny_models.flux()
    policy = PrecisionPolicy(layers={1})  # the first single-stream block
    register("mxattention", policy)
    with torch.no_grad(), policy.attach(model), attention_backend(BACKEND):
        model(**tiny_models.flux_inputs())
    c = policy.counts()
    assert c["by_layer"] == {
        0: {"quantized": 1, "high_precision": 0},
        1: {"quantized": 0, "high_precision": 1},
    }
    assert c["by_kind"] == {"self": {"quantized": 1, "high_precision": 1}}  # joint attention counts as self


def test_pipeline_with_two_experts_shares_one_step_count(register):
    from diffusers.models.attention_dispatch import attention_backend

    pipe = SimpleNamespace(transformer=tiny_models.wan(seed=0), transformer_2=tiny_models.wan(seed=1))
    policy = PrecisionPolicy.wan22(num_steps=4)
    register("mxattention", policy)
    with torch.no_grad(), policy.attach(pipe), attention_backend(BACKEND):
        for i, t in enumerate((999.0, 750.0, 500.0, 250.0)):
            expert = pipe.transformer if i < 2 else pipe.transformer_2  # Wan2.2's boundary switch
            expert(**tiny_models.wan_inputs(t=t))
    c = policy.counts()
    assert c["by_step"] == {
        0: {"quantized": 2, "high_precision": 2},
        1: {"quantized": 2, "high_precision": 2},
        2: {"quantized": 0, "high_precision": 4},
        3: {"quantized": 0, "high_precision": 4},
    }
    with pytest.raises(TypeError, match="pipeline with a transformer or unet"):
        policy.attach(SimpleNamespace(vae=None))


def test_bad_arguments_name_themselves():
    """A wrong type or value names the argument and what was expected (not a bare Python error)."""
    for bad in (40.0, "40", True, None):
        with pytest.raises(TypeError, match=r"num_steps must be an int >= 2, got"):
            PrecisionPolicy.wan22(bad)
    with pytest.raises(ValueError, match="num_steps must be an int >= 2, got 1"):
        PrecisionPolicy.wan22(1)
    for name, value in (("layers", 3), ("steps", 2.0), ("kinds", 1), ("modules", 5)):
        with pytest.raises(TypeError, match=rf"^{name} must be a"):
            PrecisionPolicy(**{name: value})
    with pytest.raises(ValueError, match="layers must hold non-negative ints, got 1.0"):
        PrecisionPolicy(layers=[1.0])


class TinyAttention(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class TwoBlocks(nn.Module):
    """Two blocks of one attention module each: blocks 0-1, modules 'blocks.0.attn', 'blocks.1.attn'."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.ModuleDict({"attn": TinyAttention()}) for _ in range(2))

    def forward(self, hidden_states: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        return hidden_states


def test_rules_that_can_never_match_warn(recwarn):
    """A block past the model's blocks or a module pattern that matches none of its sites warns at
    attach; a step at or past a run's number of steps when the run's length is known (the pipeline's
    num_timesteps in callback mode, the end of a run in timestep mode). Rules that can match do not."""
    from mxattention.integrations.policy import PolicyRuleWarning

    with pytest.warns(PolicyRuleWarning, match=r"layers 2, 7 can never match: .* 2 blocks \(0-1\)"):
        PrecisionPolicy(layers={1, 2, 7}).attach(TwoBlocks()).remove()
    with pytest.warns(PolicyRuleWarning, match=r"modules pattern 'blocks\.9\.\*' matches no"):
        PrecisionPolicy(modules=("blocks.*.attn", "blocks.9.*")).attach(TwoBlocks()).remove()
    policy, model, x = PrecisionPolicy(steps={1, 3}), TwoBlocks(), torch.zeros(1)
    with policy.attach(model):
        for t in (900.0, 600.0, 300.0):
            model(x, torch.tensor([t]))
        assert not [w for w in recwarn.list if issubclass(w.category, PolicyRuleWarning)]
        with pytest.warns(PolicyRuleWarning, match=r"steps 3 never matched: the run that ended had 3 steps"):
            model(x, torch.tensor([900.0]))  # a new generation: the last one had steps 0-2
    policy = PrecisionPolicy(steps={2, 5})
    with policy.attach(TwoBlocks(), steps="callback"):
        with pytest.warns(PolicyRuleWarning, match=r"steps 5 can never match: the pipeline runs 3 steps"):
            policy.step_callback(SimpleNamespace(num_timesteps=3), 0, None, {})
        policy.step_callback(SimpleNamespace(num_timesteps=3), 1, None, {})  # warned once
    PrecisionPolicy(layers={0, 1}, modules=("blocks.1.*",), steps={0}).attach(TwoBlocks()).remove()
    assert not [w for w in recwarn.list if issubclass(w.category, PolicyRuleWarning)]
