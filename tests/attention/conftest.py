import torch


def outlier_qkv(
    b=1, h=2, lq=96, lk=96, d=64, *, seed=0, outlier_channels=4, factor=20.0, dtype=torch.float32
):
    """Q, K, V with a few head-dim channels of Q and K scaled by `factor` (the outliers that
    Hadamard rotation spreads out), as in real diffusion-transformer activations."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g)
    k = torch.randn(b, h, lk, d, generator=g)
    v = torch.randn(b, h, lk, d, generator=g)
    ch = torch.randperm(d, generator=g)[:outlier_channels]
    q[..., ch] *= factor
    k[..., ch] *= factor
    return q.to(dtype), k.to(dtype), v.to(dtype)
