"""Numbers of the OCP Microscaling v1.0 and NVFP4 formats, in one place.

Every module that needs a format constant imports it from here; nothing else in the
package spells these numbers out.
"""

from __future__ import annotations

# E8M0 shared scale: one byte, value = exponent + 127, 0xFF = NaN.
E8M0_BIAS = 127
E8M0_MIN_EXP = -127
E8M0_MAX_EXP = 127
E8M0_NAN = 0xFF

MX_BLOCK_SIZE = 32

# NVFP4: blocks of 16 E2M1 elements, E4M3 block scale, optional FP32 tensor scale.
NVFP4_BLOCK_SIZE = 16
F4_E2M1_MAX = 6.0
F8_E4M3_MAX = 448.0
# Smallest normal E4M3 value: NVFP4 block scales are clamped up to it before the E4M3 cast, so an
# all-zero block never divides by zero (the convention of NVIDIA's reference cast and torchao's).
F8_E4M3_MIN_NORMAL = 2.0**-6

# IEEE float32 layout, used to read exponents exactly from the bits.
F32_MANTISSA_BITS = 23
F32_EXP_BIAS = 127
