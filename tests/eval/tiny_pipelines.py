"""Tiny diffusers pipelines with random weights for the eval tests (milliseconds a step on a CPU)."""

from __future__ import annotations

from typing import Any

import torch


def tiny_ldm_pipeline() -> Any:
    """LDMTextToImagePipeline: tiny UNet2DConditionModel + LDMBert + AutoencoderKL (as "vqvae": a VQ
    model would snap the latents to its codebook and hide the UNet's changes); BERT tokenizer from the
    MiniLM package (local files), so nothing is downloaded. Attention: the UNet's self- and
    cross-attention (torch SDPA through diffusers' AttnProcessor2_0) and the VAE decoder's mid-block."""
    from diffusers import AutoencoderKL, DDIMScheduler, LDMTextToImagePipeline, UNet2DConditionModel
    from diffusers.pipelines.latent_diffusion.pipeline_latent_diffusion import LDMBertConfig, LDMBertModel
    from transformers import BertTokenizer

    from mxattention.eval.models.minilm import minilm_model_dir

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(16, 32),
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        norm_num_groups=8,
    )
    bert = LDMBertModel(
        LDMBertConfig(
            d_model=32,
            encoder_layers=2,
            encoder_attention_heads=2,
            head_dim=16,
            encoder_ffn_dim=64,
            vocab_size=30522,
        )
    )
    tok = BertTokenizer.from_pretrained(str(minilm_model_dir()), local_files_only=True)
    for m in (unet, vae, bert):  # as from_pretrained leaves them (LDMBert has dropout)
        m.eval()
    return LDMTextToImagePipeline(vqvae=vae, bert=bert, tokenizer=tok, unet=unet, scheduler=DDIMScheduler())
