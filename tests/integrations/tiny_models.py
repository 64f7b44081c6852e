"""Real diffusers transformers from tiny configs with seeded random weights, and inputs for them.

Every model has 2 heads of dim 32 and 128 video / image tokens plus 16 text tokens, so one forward
pass costs milliseconds on a CPU. Weights depend only on the seed.
"""

from __future__ import annotations

from typing import Any

import torch

N_TEXT = 16
N_TEXT_VALID = 11  # HunyuanVideo: the last 5 text tokens are padding, masked out


# The tiny Wan transformer's configuration (also built through xfuser's wrapper in test_xdit).
WAN_CONFIG = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=32,
    in_channels=4,
    out_channels=4,
    text_dim=32,
    freq_dim=32,
    ffn_dim=64,
    num_layers=2,
    rope_max_seq_len=32,
)


def wan(seed: int = 0, num_layers: int = 2) -> torch.nn.Module:
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return WanTransformer3DModel(**{**WAN_CONFIG, "num_layers": num_layers}).eval()


def wan_inputs(seed: int = 1, batch: int = 1, t: float = 500.0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {
        "hidden_states": torch.randn(batch, 4, 2, 16, 16, generator=g),
        "timestep": torch.full((batch,), t),
        "encoder_hidden_states": torch.randn(batch, N_TEXT, 32, generator=g),
        "return_dict": False,
    }


def hunyuan(seed: int = 0) -> torch.nn.Module:
    from diffusers import HunyuanVideoTransformer3DModel

    torch.manual_seed(seed)
    return HunyuanVideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=32,
        num_layers=1,
        num_single_layers=1,
        num_refiner_layers=1,
        patch_size=2,
        patch_size_t=1,
        text_embed_dim=32,
        pooled_projection_dim=16,
        rope_axes_dim=(8, 12, 12),
    ).eval()


def hunyuan_inputs(seed: int = 1, text_valid: int = N_TEXT_VALID) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    text_mask = torch.zeros(1, N_TEXT, dtype=torch.long)
    text_mask[:, :text_valid] = 1
    return {
        "hidden_states": torch.randn(1, 4, 2, 16, 16, generator=g),
        "timestep": torch.tensor([500]),
        "encoder_hidden_states": torch.randn(1, N_TEXT, 32, generator=g),
        "encoder_attention_mask": text_mask,
        "pooled_projections": torch.randn(1, 16, generator=g),
        "guidance": torch.tensor([3500.0]),
        "return_dict": False,
    }


def flux(seed: int = 0) -> torch.nn.Module:
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    return FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=32,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=16,
        axes_dims_rope=(8, 12, 12),
    ).eval()


def flux_inputs(seed: int = 1) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    img_ids = torch.zeros(128, 3)
    img_ids[:, 1] = torch.arange(128) // 16
    img_ids[:, 2] = torch.arange(128) % 16
    return {
        "hidden_states": torch.randn(1, 128, 16, generator=g),
        "encoder_hidden_states": torch.randn(1, N_TEXT, 32, generator=g),
        "pooled_projections": torch.randn(1, 16, generator=g),
        "timestep": torch.tensor([0.5]),
        "img_ids": img_ids,
        "txt_ids": torch.zeros(N_TEXT, 3),
        "return_dict": False,
    }


# name -> (builder, inputs, attention calls per forward, bool key mask [B, 1, 1, N] or None)
MODELS = {
    "wan": (wan, wan_inputs, 4, None),
    "hunyuan": (hunyuan, hunyuan_inputs, 2, (1, 1, 1, 128 + N_TEXT)),
    "flux": (flux, flux_inputs, 2, None),
}


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def to(inputs: dict[str, Any], device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
    """Inputs moved to `device`; floating tensors other than timesteps cast to `dtype`."""
    return {
        k: v.to(device, dtype)
        if isinstance(v, torch.Tensor) and v.is_floating_point() and k != "timestep"
        else v.to(device)
        if isinstance(v, torch.Tensor)
        else v
        for k, v in inputs.items()
    }
