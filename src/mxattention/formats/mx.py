"""MX block quantization (OCP Microscaling v1.0) with a choice of shared-scale rule.

Exposes `mx_quantize` (packed codes + E8M0 scales in an `MXTensor`), `pow2` (exact 2**e on every
device) and `fake_quantize`
(the dequantized values, in the input's dtype). Both:

- split `axis` into blocks of `block_size` consecutive elements (zero-padding a ragged tail
  inside the cast; padding never changes a block maximum and is cut off again),
- pick each block's exponent e with the rule (`"ocp"`, `"tfs"`, `"uos"`, a float q, or a
  `ScaleRule`), clamped to E8M0's [-127, 127]; an all-zero block gets scale 1,
- round x / 2**e to the element ladder (nearest, ties to even, saturating),
- mark a block holding NaN or +-Inf with scale byte 0xFF: it decodes to NaN (its element
  codes are stored as 0). Inf is treated like NaN, as docs/design.md, 'MX formats', decides.

All arithmetic is float32 (fp16 / bf16 inputs are upcast exactly): x * 2**-e is exact for every
value that can round to a non-zero element. A dequantized value can exceed the output dtype's
range only for blocks within a few percent of its largest finite value (e.g. 65504 in fp16
rounds to 4 * 2**14 = 65536 under UOS): it then becomes +-Inf, as any cast would make it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mxattention.formats._checks import check_block_size, check_float_tensor, normalize_axis
from mxattention.formats.constants import E8M0_BIAS, E8M0_NAN, MX_BLOCK_SIZE
from mxattention.formats.ladders import ElementLadder, get_ladder
from mxattention.formats.packing import pack_uint4, unpack_uint4
from mxattention.formats.rounding import decode_codes, ladder_codes, round_to_ladder
from mxattention.formats.scale_rules import ScaleRule, resolve_rule, shared_exponent


@dataclass(frozen=True)
class MXTensor:
    """An MX-quantized tensor.

    `data`: uint8 element codes with the quantized axis moved last and zero-padded to a multiple
    of `block_size`; 4-bit ladders pack two codes per byte (element 2i in the low nibble), so the
    last dim is padded_len / 2, other ladders store one code per byte.
    `scales`: uint8 E8M0 bytes (exponent + 127, 0xFF = NaN), shape (*data.shape[:-1], n_blocks).
    `shape`, `axis`, `dtype`: the original tensor's; `ladder`, `rule`, `block_size`: the cast's.
    """

    data: torch.Tensor
    scales: torch.Tensor
    shape: torch.Size
    axis: int
    dtype: torch.dtype
    ladder: ElementLadder
    rule: ScaleRule
    block_size: int

    @property
    def codes(self) -> torch.Tensor:
        """Unpacked element codes, one per byte, axis last, padded."""
        return unpack_uint4(self.data) if self.ladder.bits == 4 else self.data

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Decode to a tensor of the original shape, in `dtype` (default: the original dtype)."""
        codes = self.codes
        vals = decode_codes(codes, self.ladder).unflatten(-1, (-1, self.block_size))
        exps = self.scales.to(torch.int32) - E8M0_BIAS
        out = vals * pow2(exps).unsqueeze(-1)
        out = torch.where((self.scales == E8M0_NAN).unsqueeze(-1), float("nan"), out)
        n = self.shape[self.axis]
        out = out.flatten(-2)[..., :n].movedim(-1, self.axis)
        return out.to(dtype or self.dtype)


def _blocks(x: torch.Tensor, axis: int, block_size: int) -> torch.Tensor:
    """float32 view (*rest, n_blocks, block_size) of x with `axis` last, zero-padded."""
    xf = x.movedim(axis, -1).to(torch.float32).contiguous()
    pad = (-xf.shape[-1]) % block_size
    if pad:
        xf = torch.nn.functional.pad(xf, (0, pad))
    return xf.unflatten(-1, (-1, block_size))


def pow2(e: torch.Tensor) -> torch.Tensor:
    """2**e as float32 for integer e in [-127, 128] (2**-127 subnormal, 2**128 = inf), built from
    the bits so it is exact on every device: CUDA's torch.exp2 flushes 2**-127 to 0 (the H200's
    reference zeroed every P~ block scaled 2**-127, test_pv8_causal_tiles_and_tiny_p_blocks)."""
    e = e.to(torch.int32)
    bits = torch.where(e >= -126, (e + 127) << 23, torch.full_like(e, 0x400000))
    return bits.view(torch.float32)


def _block_scale(xb: torch.Tensor, rule: ScaleRule, ladder: ElementLadder, min_exp: int | None = None):
    """(exponent int32, bad-block mask, 2**-e float32) per block of xb (*, n_blocks, block_size); the
    exponent at least `min_exp` where given."""
    amax = xb.abs().amax(dim=-1)
    bad = ~torch.isfinite(amax)
    e = shared_exponent(amax, rule, ladder)
    if min_exp is not None:
        e = e.clamp(min=min_exp)
    inv = pow2(-e)
    return e, bad, inv


def _prepare(x, axis, rule, elem, block_size, name="x"):
    x = check_float_tensor(x, name)
    axis = normalize_axis(axis, x.dim())
    block_size = check_block_size(block_size)
    ladder = get_ladder(elem)
    return x, axis, resolve_rule(rule, ladder), ladder, block_size


def mx_quantize(
    x: torch.Tensor,
    axis: int = -1,
    *,
    rule: str | float | ScaleRule = "uos",
    elem: str | ElementLadder = "e2m1",
    block_size: int = MX_BLOCK_SIZE,
) -> MXTensor:
    """Quantize `x` to MX format in blocks of `block_size` along `axis` (see the module doc).

    `x`: fp32 / fp16 / bf16, any shape with at least one dim, on any device (PyTorch ops on x's
    device; the attention kernels have their own fused casts). `rule`: "ocp", "tfs",
    "uos" (the ladder's optimal boundary, 7.25 for E2M1), a float boundary q > 0 or a `ScaleRule`;
    `elem`: the element ladder ("e2m1" = MXFP4, "e2m3", "e3m2", "e4m3", "e5m2"). Returns an
    `MXTensor`: uint8 codes with `axis` moved last and padded to a multiple of `block_size` (two
    4-bit codes per byte), uint8 E8M0 scales [..., n_blocks] (0xFF for a block holding NaN or
    +-Inf), and what `dequantize()` needs to give x's shape and dtype back. Raises TypeError (x not a
    float tensor of those dtypes, `axis` / `block_size` not an int, a rule of another type) or
    ValueError (0-dim x, `axis` out of range, `block_size` not a positive even int, an unknown rule
    name or a boundary that is not a finite positive number, an unknown ladder).
    """
    x, axis, rule_, ladder, block_size = _prepare(x, axis, rule, elem, block_size)
    xb = _blocks(x, axis, block_size)
    e, bad, inv = _block_scale(xb, rule_, ladder)
    codes = ladder_codes(xb * inv.unsqueeze(-1), ladder)
    codes = torch.where(bad.unsqueeze(-1), torch.zeros_like(codes), codes).flatten(-2)
    scales = torch.where(bad, E8M0_NAN, (e + E8M0_BIAS).to(torch.uint8)).to(torch.uint8)
    data = pack_uint4(codes) if ladder.bits == 4 else codes
    return MXTensor(data, scales, x.shape, axis, x.dtype, ladder, rule_, block_size)


def fake_quantize(
    x: torch.Tensor,
    axis: int = -1,
    *,
    rule: str | float | ScaleRule = "uos",
    elem: str | ElementLadder = "e2m1",
    block_size: int = MX_BLOCK_SIZE,
    min_exp: int | None = None,
) -> torch.Tensor:
    """MX quantize-dequantize of `x` along `axis`; returns x's shape and dtype.

    Equal, element for element, to `mx_quantize(x, ...).dequantize()`, without packing: blocks
    holding NaN or +-Inf become NaN, and a value rounded past the output dtype's range becomes +-Inf.
    `min_exp` (an int in [-127, 127], or None): a floor on every block's shared exponent, so a block
    whose rule gives a smaller scale is rounded on the grid of 2**min_exp instead (its small values
    to 0): the fast mode's P~ (`attention.fast`), whose FP8 fold holds blocks scaled >= 2**-16 exactly.
    Arguments, devices and what raises: as `mx_quantize`; ValueError for a `min_exp` out of range.
    """
    if min_exp is not None and (
        isinstance(min_exp, bool) or not isinstance(min_exp, int) or abs(min_exp) > 127
    ):
        raise ValueError(f"min_exp must be an int in [-127, 127] or None, got {min_exp!r}")
    x, axis, rule_, ladder, block_size = _prepare(x, axis, rule, elem, block_size)
    n = x.shape[axis]
    xb = _blocks(x, axis, block_size)
    e, bad, inv = _block_scale(xb, rule_, ladder, min_exp)
    scale = torch.where(bad, float("nan"), pow2(e))
    out = round_to_ladder(xb * inv.unsqueeze(-1), ladder).mul_(scale.unsqueeze(-1))
    return out.flatten(-2)[..., :n].movedim(-1, axis).to(x.dtype)
