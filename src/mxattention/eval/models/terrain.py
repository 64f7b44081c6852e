"""The heightmap UNet of ``adaptive-terrain-diffusion`` in PyTorch, attention routed through any ``AttnFn``.

Public: ``terrain_onnx_path``, ``load_terrain_unet``, ``count_attention_layers``, ``denoise``, ``denoise_seeds``,
``generate_heightmaps``, ``capture_terrain_qkv``, ``heights_from_model_space`` and the sampler constants.

The package ships a consistency-distilled UNet (10.5M parameters, 128x128 heightmaps) as ONNX (opset 18)
and samples it with onnxruntime in one step (``terrain_diffusion/generator.py``). Here the ONNX graph is
converted with ``onnx2torch`` and each of its 28 self-attentions, exported by torch as

    q, k, v = split(qkv_conv(x).reshape(B, 3C, T))          # each [B, C, T], channel c = h*32 + d
    w = softmax(einsum("bct,bcs->bts", q * 32**-0.25 -> [B*H, 32, T], k * 32**-0.25 -> [B*H, 32, T]))
    o = einsum("bts,bcs->bct", w, v -> [B*H, 32, T])         # then reshaped back to [B, C, T]

is replaced, with torch.fx, by a module that reshapes to [B, H, T, 32] and calls
``attn_fn(q, k, v, scale=1.0)``: q and k already carry 32**-0.25 each, i.e. 1/sqrt(32) together.
In call order the layers see T = 1024 tokens (32x32) x 4, 256 (16x16) x 4, 64 (8x8) x 10,
256 x 5, 1024 x 5, with 2, 3 and 4 heads at 1024, 256 and 64 tokens (C = 64, 96, 128). The exported
graph hard-codes these token counts, so inputs must be 128x128.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.resources
import math
import sys
import types
from collections.abc import Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import fx

from mxattention.eval.models.qkv import AttnFn, LayerQKV, QKVRecorder

# Sampler constants of terrain_diffusion.TerrainGenerator (v0.4.2), which is fixed to one step.
NATIVE_SIZE = 128
NUM_CLASSES = 100  # difficulty labels 1..100
HEIGHT_RANGE_M = 22.16864013671875
ASINH_SCALE_M = 0.1
SIGMA_MAX = 80.0
DEFAULT_STEPS = 1
HEAD_DIM = 32
ATTENTION_LAYERS = 28

_ONNX_RESOURCE = "weights/terrain_consistency_unet_difficulty100.onnx"
_ACTIVE_ATTN_FN: contextvars.ContextVar[AttnFn | None] = contextvars.ContextVar(
    "mxattention_terrain_attn_fn", default=None
)


def terrain_onnx_path() -> Path:
    """Path of the ONNX UNet bundled in the ``terrain_diffusion`` package."""
    resource = importlib.resources.files("terrain_diffusion").joinpath(_ONNX_RESOURCE)
    if not resource.is_file():
        raise FileNotFoundError(f"terrain_diffusion has no {_ONNX_RESOURCE}; reinstall the package")
    return Path(str(resource))


# ---------------------------------------------------------------------------------------------------
# ONNX -> torch


def _import_onnx2torch() -> Any:
    """Import onnx2torch, which imports torchvision only for its NMS / RoiAlign converters.

    A CPU-only torch build has no matching torchvision on PyPI (the published wheels fail to load their
    C++ ops beside it), so when torchvision cannot be imported a placeholder stands in during the import;
    converting a graph that holds NMS or RoiAlign then fails loudly. This UNet holds neither.
    """
    if "onnx2torch" in sys.modules:
        return sys.modules["onnx2torch"]
    try:
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError):
        pass
    else:
        import onnx2torch

        return onnx2torch

    def unavailable(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("torchvision is not importable here; NMS / RoiAlign cannot run")

    saved = {name: sys.modules.get(name) for name in ("torchvision", "torchvision.ops")}
    placeholder = types.ModuleType("torchvision")
    placeholder.ops = types.ModuleType("torchvision.ops")  # type: ignore[attr-defined]
    for name in ("roi_align", "nms", "box_convert"):
        setattr(placeholder.ops, name, unavailable)  # type: ignore[attr-defined]
    sys.modules["torchvision"], sys.modules["torchvision.ops"] = placeholder, placeholder.ops  # type: ignore[attr-defined]
    try:
        import onnx2torch
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return onnx2torch


class _OnnxSplit18(torch.nn.Module):
    """ONNX Split-18: equal chunks of ceil(n / num_outputs) (last one smaller) or explicit sizes."""

    def __init__(self, axis: int, num_outputs: int) -> None:
        super().__init__()
        self.axis = axis
        self.num_outputs = num_outputs

    def forward(self, x: torch.Tensor, split: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        if split is not None:
            return torch.split(x, split.tolist(), dim=self.axis)
        return torch.split(x, -(-x.shape[self.axis] // self.num_outputs), dim=self.axis)


def _register_opset18_converters(onnx2torch: Any) -> None:
    """Add the two opset-18 converters onnx2torch 1.5 lacks (Split, Resize), unless it has them."""
    from onnx2torch.node_converters.registry import add_converter, get_converter
    from onnx2torch.utils.common import OperationConverterResult, onnx_mapping_from_node

    def missing(op: str) -> bool:
        try:
            get_converter(op, 18)
        except NotImplementedError:
            return True
        return False

    if missing("Split"):

        @add_converter(operation_type="Split", version=18)
        def _split(node: Any, graph: Any) -> Any:
            axis = node.attributes.get("axis", 0)
            num_outputs = node.attributes.get("num_outputs", len(node.output_values))
            return OperationConverterResult(
                torch_module=_OnnxSplit18(axis, num_outputs), onnx_mapping=onnx_mapping_from_node(node)
            )

    if missing("Resize"):
        resize13 = get_converter("Resize", 13)

        @add_converter(operation_type="Resize", version=18)
        def _resize(node: Any, graph: Any) -> Any:
            # Resize-18 only adds antialias, axes, keep_aspect_ratio_policy; at defaults it is Resize-13.
            attrs = node.attributes
            if (
                attrs.get("antialias", 0) != 0
                or "axes" in attrs
                or attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch"
            ):
                raise NotImplementedError(f"Resize-18 with non-default attributes: {dict(attrs)}")
            return resize13(node, graph)


def _drop_reshape_allowzero(model: Any) -> None:
    """Rewrite Reshape(allowzero=1) as allowzero=0, after checking that no shape entry can be 0.

    The two differ only for a 0 in the target shape (literal 0 vs copy-the-input-dim). Every such shape
    in this graph is a Concat of the batch size (>= 1), batch*heads, -1 and positive constants.
    """
    from onnx import numpy_helper

    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    producer = {out: node for node in model.graph.node for out in node.output}
    for node in model.graph.node:
        if node.op_type != "Reshape" or not any(a.name == "allowzero" and a.i == 1 for a in node.attribute):
            continue
        shape = node.input[1]
        parts = [shape] if shape in constants else list(producer[shape].input)
        if shape not in constants and producer[shape].op_type != "Concat":
            raise NotImplementedError(f"Reshape {node.name}: cannot prove its shape has no zero")
        if any(part in constants and (constants[part] == 0).any() for part in parts):
            raise NotImplementedError(f"Reshape {node.name}: allowzero=1 with a literal 0 in its shape")
        kept = [a for a in node.attribute if a.name != "allowzero"]
        del node.attribute[:]
        node.attribute.extend(kept)


class RoutedAttention(torch.nn.Module):
    """Replaces one ``einsum -> softmax -> einsum`` attention of the converted graph.

    Inputs are the graph's own operands q, k, v as [B*H, D, T] (q and k pre-multiplied by D**-0.25)
    plus the model input ``noisy`` [B, 1, 128, 128], used only for B. Output [B*H, D, T].
    """

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch_ref: torch.Tensor
    ) -> torch.Tensor:
        attn_fn = _ACTIVE_ATTN_FN.get()
        if attn_fn is None:  # the exported model's own math, op for op
            weights = torch.softmax(torch.einsum("bct,bcs->bts", q, k), dim=-1)
            return torch.einsum("bts,bcs->bct", weights, v)
        batch_heads, dim, tokens = q.shape
        if dim != HEAD_DIM:
            raise RuntimeError(
                f"routed attention {self.index}: head dim {dim}, graph was checked for {HEAD_DIM}"
            )
        batch = batch_ref.shape[0]
        heads = batch_heads // batch

        def to_bhld(x: torch.Tensor) -> torch.Tensor:  # [B*H, D, T], b-major -> [B, H, T, D]
            return x.reshape(batch, heads, dim, x.shape[-1]).transpose(-1, -2)

        out = attn_fn(
            to_bhld(q), to_bhld(k), to_bhld(v), attn_mask=None, dropout_p=0.0, is_causal=False, scale=1.0
        )
        return out.transpose(-1, -2).reshape(batch_heads, dim, tokens)


def _route_attention(gm: fx.GraphModule) -> int:
    """Swap every attention subgraph of ``gm`` for a ``RoutedAttention``; returns how many."""
    from onnx2torch.node_converters.einsum import OnnxEinsum

    modules = dict(gm.named_modules())

    def module_of(node: fx.Node) -> torch.nn.Module | None:
        return modules.get(node.target) if node.op == "call_module" else None  # type: ignore[arg-type]

    def is_einsum(node: fx.Node, equation: str) -> bool:
        mod = module_of(node)
        return isinstance(mod, OnnxEinsum) and mod.equation.replace(" ", "") == equation

    def prescale(operand: fx.Node) -> float:
        """The constant c of ``reshape(x * c)`` feeding the scores einsum (NaN if not that shape)."""
        mul = operand.args[0] if module_of(operand) is not None and operand.args else None
        mul_mod = module_of(mul) if isinstance(mul, fx.Node) else None
        if getattr(mul_mod, "math_op_function", None) is not torch.mul or mul.args[1].op != "get_attr":
            return math.nan
        factor = gm.get_buffer(mul.args[1].target)
        return float(factor) if factor.numel() == 1 else math.nan

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    batch_ref = placeholders[0]
    count = 0
    for scores in list(gm.graph.nodes):
        if not is_einsum(scores, "bct,bcs->bts") or len(scores.users) != 1:
            continue
        softmax = next(iter(scores.users))
        soft_mod = module_of(softmax)
        if (
            not isinstance(soft_mod, torch.nn.Softmax)
            or soft_mod.dim not in (-1, 2)
            or len(softmax.users) != 1
        ):
            continue
        mix = next(iter(softmax.users))
        if not is_einsum(mix, "bts,bcs->bct") or mix.args[0] is not softmax:
            continue
        q, k = scores.args
        v = mix.args[1]
        # scale=1.0 below is right only because the graph multiplies q and k by D**-0.25 each.
        qk_scale = prescale(q) * prescale(k)
        if not math.isclose(qk_scale, HEAD_DIM**-0.5, rel_tol=1e-6):
            raise RuntimeError(
                f"attention at {scores.name}: q*k pre-scale {qk_scale}, not 1/sqrt({HEAD_DIM})"
            )
        name = f"routed_attention_{count}"
        gm.add_submodule(name, RoutedAttention(count))
        with gm.graph.inserting_before(mix):
            routed = gm.graph.call_module(name, args=(q, k, v, batch_ref))
        mix.replace_all_uses_with(routed)
        for node in (mix, softmax, scores):
            gm.graph.erase_node(node)
        count += 1
    gm.graph.lint()
    gm.delete_all_unused_submodules()
    gm.recompile()
    return count


@lru_cache(maxsize=1)
def load_terrain_unet() -> torch.nn.Module:
    """The UNet as a torch.fx GraphModule (fp32, eval), attention routed; converted once per process.

    Call it as ``model(noisy [B, 1, 128, 128], sigma [B], difficulty [B])`` -> denoised [B, 1, 128, 128],
    all fp32; ``difficulty`` is the label mapped to [0, 1] (see ``difficulty_label``), sigma in the
    EDM/Karras noise scale. Prefer ``denoise``, which selects the attention function.
    """
    import onnx

    onnx2torch = _import_onnx2torch()
    _register_opset18_converters(onnx2torch)
    model = onnx.load(str(terrain_onnx_path()))
    _drop_reshape_allowzero(model)
    gm = onnx2torch.convert(model)
    found = _route_attention(gm)
    if found != ATTENTION_LAYERS:
        raise RuntimeError(
            f"expected {ATTENTION_LAYERS} attention subgraphs in the terrain UNet, found {found}"
        )
    return gm.eval()


def count_attention_layers(model: torch.nn.Module) -> int:
    """Number of routed attention layers in a model from ``load_terrain_unet`` (28)."""
    return sum(isinstance(m, RoutedAttention) for m in model.modules())


@contextlib.contextmanager
def _attention(attn_fn: AttnFn | None) -> Iterator[None]:
    token = _ACTIVE_ATTN_FN.set(attn_fn)
    try:
        yield
    finally:
        _ACTIVE_ATTN_FN.reset(token)


@torch.inference_mode()
def denoise(
    noisy: torch.Tensor, sigma: torch.Tensor, difficulty: torch.Tensor, attn_fn: AttnFn | None = None
) -> torch.Tensor:
    """One UNet evaluation: denoised [B, 1, 128, 128] fp32 in model space (about [-1, 1]).

    ``noisy`` [B, 1, 128, 128], ``sigma`` [B] (noise std in model units), ``difficulty`` [B] labels in [0, 1].
    ``attn_fn`` None runs the exported graph's own attention math.
    """
    if noisy.ndim != 4 or tuple(noisy.shape[1:]) != (1, NATIVE_SIZE, NATIVE_SIZE) or noisy.shape[0] == 0:
        raise ValueError(f"noisy must be [B>=1, 1, {NATIVE_SIZE}, {NATIVE_SIZE}], got {tuple(noisy.shape)}")
    model = load_terrain_unet()
    with _attention(attn_fn):
        return model(noisy.float(), sigma.float(), difficulty.float())


# ---------------------------------------------------------------------------------------------------
# Sampling, as terrain_diffusion.TerrainGenerator.generate(..., size_mode="resize") at 128x128


def difficulty_label(difficulty: int) -> float:
    """Model label in [0, 1] of a difficulty 1..100, as the package maps it."""
    if not 1 <= difficulty <= NUM_CLASSES:
        raise ValueError(f"difficulty must be in 1..{NUM_CLASSES}, got {difficulty}")
    return float(np.float32((difficulty - 1) / (NUM_CLASSES - 1)))


def heights_from_model_space(values: torch.Tensor, zero_floor: bool = True) -> torch.Tensor:
    """Model-space maps [N, 1, H, W] -> heights in metres [N, 1, H, W] in [0, 22.17], as the package.

    The model works in ``2 * asinh(h / 0.1) / asinh(22.17 / 0.1) - 1``; ``zero_floor`` shifts each
    map so its lowest point is 0 m (the package's default).
    """
    unit = ((values + 1.0) * 0.5).clamp(0.0, 1.0)
    normalizer = math.asinh(HEIGHT_RANGE_M / ASINH_SCALE_M)
    heights = (ASINH_SCALE_M * torch.sinh(unit * normalizer)).clamp(0.0, HEIGHT_RANGE_M)
    if zero_floor:
        heights = heights - heights.amin(dim=(-2, -1), keepdim=True)
    return heights


def denoise_seeds(
    seeds: Sequence[int],
    attn_fn: AttnFn | None = None,
    difficulty: int | None = None,
    batch_size: int = 1,
) -> torch.Tensor:
    """The denoised maps [N, 1, 128, 128] fp32 in model space (about [-1, 1]), one per seed, before
    ``heights_from_model_space``; ``generate_heightmaps`` documents the sampling and the arguments."""
    if not seeds:
        raise ValueError("seeds must not be empty")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    outputs = []
    for start in range(0, len(seeds), batch_size):
        chunk = seeds[start : start + batch_size]
        rngs = [np.random.default_rng(seed) for seed in chunk]
        labels = torch.tensor(
            [
                difficulty_label(int(rng.integers(1, NUM_CLASSES + 1)) if difficulty is None else difficulty)
                for rng in rngs
            ],
            dtype=torch.float32,
        )
        shape = (1, 1, NATIVE_SIZE, NATIVE_SIZE)
        noise = np.concatenate([rng.standard_normal(shape, dtype=np.float32) for rng in rngs])
        noisy = torch.from_numpy(noise * np.float32(SIGMA_MAX))
        outputs.append(denoise(noisy, torch.full((len(chunk),), SIGMA_MAX), labels, attn_fn))
    return torch.cat(outputs)


def generate_heightmaps(
    seeds: Sequence[int],
    attn_fn: AttnFn | None = None,
    steps: int = DEFAULT_STEPS,
    difficulty: int | None = None,
    batch_size: int = 1,
) -> torch.Tensor:
    """Heightmaps [N, 1, 128, 128] fp32 in metres (lowest point 0 m), one per seed, attention by ``attn_fn``.

    For each seed this draws exactly what ``TerrainGenerator().generate(1, seed=seed, difficulty=...)``
    draws with numpy's ``default_rng(seed)``: the difficulty (when ``difficulty`` is None, the package's
    "random" default, uniform on 1..100), then the noise [1, 1, 128, 128] * sigma_max, and denoises it
    in one step at sigma_max = 80, so the noise of a seed is the same for every ``attn_fn`` and the
    result matches the package's. ``steps`` must be 1: the distilled model is one-step only (the package
    refuses other values too; multistep consistency sampling was tried and saturates the maps).
    Seeds run ``batch_size`` at a time; the default 1 keeps each map independent of the other seeds in
    the list, even for an attention whose quantization scales span the batch.
    """
    if steps != DEFAULT_STEPS:
        raise ValueError(f"the distilled terrain model samples in exactly {DEFAULT_STEPS} step, got {steps}")
    return heights_from_model_space(denoise_seeds(seeds, attn_fn, difficulty, batch_size))


def capture_terrain_qkv(
    seeds: Sequence[int], inner: AttnFn | None = None, difficulty: int | None = None
) -> list[LayerQKV]:
    """q, k, v [N, H, T, 32] fp32 of the 28 attention calls (in call order) generating ``seeds`` as one batch.

    ``inner`` computes the attention during the capture (None: torch SDPA), so later layers see its
    effect. Each record has ``scale`` 1.0 and no mask; ``out`` is the inner function's output.
    """
    recorder = QKVRecorder(inner)
    generate_heightmaps(seeds, attn_fn=recorder, difficulty=difficulty, batch_size=len(seeds))
    return recorder.records
