"""Numeric formats: element ladders, MX block casts (OCP / TFS / UOS rules), NVFP4.

Public: `mx_quantize`, `fake_quantize`, `MXTensor`, `nvfp4_quantize`, `nvfp4_fake_quantize`,
`NVFP4Tensor`, the ladders (`E2M1` ... `E5M2`, `get_ladder`) and the rules (`ScaleRule`,
`ScaleMode`, `resolve_rule`). Constants live in `mxattention.formats.constants`.
"""

from mxattention.formats.ladders import E2M1, E2M3, E3M2, E4M3, E5M2, LADDERS, ElementLadder, get_ladder
from mxattention.formats.mx import MXTensor, fake_quantize, mx_quantize
from mxattention.formats.nvfp4 import NVFP4Tensor, nvfp4_fake_quantize, nvfp4_quantize
from mxattention.formats.scale_rules import ScaleMode, ScaleRule, resolve_rule

__all__ = [
    "E2M1",
    "E2M3",
    "E3M2",
    "E4M3",
    "E5M2",
    "LADDERS",
    "ElementLadder",
    "MXTensor",
    "NVFP4Tensor",
    "ScaleMode",
    "ScaleRule",
    "fake_quantize",
    "get_ladder",
    "mx_quantize",
    "nvfp4_fake_quantize",
    "nvfp4_quantize",
    "resolve_rule",
]
