"""The attention kernel's P~ cast (`block_scale` + `elem_round`) equals `fake_quantize` bit for bit,
on E2M1 and on E4M3 (MXFP8, 3 mantissa bits, saturation at 448, subnormals at 2**-9).

`block_scale` takes the shared exponent from the bits in four integer ops (boundaries >= 2); it must
give the same 2**e as the general `shared_exponent` (and the PyTorch rule) for every block maximum
in its domain (0 < amax < 2**127), subnormals included, and 2**-127 for an all-zero block. A
boundary below 2 (1.5 here) takes the general path.
"""

import warnings

import pytest
import torch

from mxattention.formats.ladders import E2M1, E4M3, get_ladder
from mxattention.formats.mx import fake_quantize
from mxattention.formats.scale_rules import resolve_rule, shared_exponent
from mxattention.kernels._triton import tl, triton
from mxattention.kernels.cast import (
    block_scale,
    cast_packed,
    dequant_e2m1,
    dequant_e4m3,
    elem_code,
    elem_round,
    exp2_int,
    inv_exp2,
    ladder_code,
)
from mxattention.kernels.cast import shared_exponent as kernel_shared_exponent
from mxattention.kernels.rules import rule_constants
from tests.formats.hard_values import hard_values

# Rows of 32 per program of the test kernels: the interpreter's cost is per program and per op, not
# per element, so few wide programs keep these exhaustive checks cheap (the values are the same).
ROWS = 256
RULES = ("ocp", "tfs", "uos", 5.3, 7.0000001, 2.5, 1.5)
# (elem, rule): E2M1 with every rule above, E4M3 with its own (boundaries 448, 464 + 2**-15, 300,
# 500, and 1.5 on the general path).
ELEM_RULES = [("e2m1", r) for r in RULES] + [("e4m3", r) for r in ("ocp", "tfs", "uos", 300.0, 500.0, 1.5)]


@triton.jit
def _p_cast_kernel(
    X,
    Scale,
    General,
    Out,
    CEIL: tl.constexpr,
    Q_EXP: tl.constexpr,
    Q_MANT: tl.constexpr,
    ELEM: tl.constexpr,
    R: tl.constexpr,
):
    rows = tl.program_id(0) * R + tl.arange(0, R)
    x = tl.load(X + rows[:, None] * 32 + tl.arange(0, 32)[None, :])
    amax = tl.max(x, 1)
    two_e = block_scale(amax, CEIL, Q_EXP, Q_MANT)
    tl.store(Scale + rows, two_e)
    tl.store(General + rows, exp2_int(kernel_shared_exponent(amax, CEIL, Q_EXP, Q_MANT)))
    tl.store(Out + rows[:, None] * 32 + tl.arange(0, 32)[None, :], elem_round(x, two_e[:, None], ELEM))


def _run(x: torch.Tensor, rule, device, elem="e2m1"):
    rc = rule_constants(rule, elem)
    x = x.to(device).contiguous()
    n = x.shape[0]
    scale, general = (torch.empty(n, device=device) for _ in range(2))
    out = torch.empty_like(x)
    _p_cast_kernel[(n // ROWS,)](x, scale, general, out, rc.ceil, rc.q_exp, rc.q_mant, elem, ROWS)
    return scale.cpu(), general.cpu(), out.cpu()


def _nonneg_blocks(seed: int, below: float = 2.0**126, elem: str = "e2m1") -> torch.Tensor:
    """Nonnegative hard values in blocks of 32, blocks with a larger maximum zeroed."""
    x = hard_values(get_ladder(elem), 32 * 2048, seed=seed).abs().view(-1, 32)
    return torch.where(x.amax(-1, keepdim=True) < below, x, 0.0)


@pytest.mark.parametrize("elem,rule", ELEM_RULES)
def test_block_scale_equals_shared_exponent(elem, rule, device):
    x = _nonneg_blocks(seed=1, elem=elem)
    with warnings.catch_warnings():
        # The kernel also rounds; above e2m1_round's domain (2**105) that output, unused here,
        # overflows in the interpreter (6 * 2**127 for the 1.5 boundary).
        warnings.simplefilter("ignore", RuntimeWarning)
        scale, general, _ = _run(x, rule, device, elem)
    amax = x.amax(-1)
    ladder = get_ladder(elem)
    ref = torch.exp2(shared_exponent(amax, resolve_rule(rule, ladder), ladder).float())
    pos = amax > 0
    assert pos.sum() > 1500 and (pos & (amax < 2.0**-126)).sum() > 20  # subnormal maxima are covered
    assert torch.equal(scale[pos], ref[pos])
    assert torch.equal(general[pos], ref[pos])
    zero_scale = 2.0**-127 if rule_constants(rule, elem).q_exp >= 1 else 1.0
    assert (scale[~pos] == zero_scale).all()


def _e4m3_ties(g: torch.Generator) -> torch.Tensor:
    """Blocks [n, 32] of P~-like values (max 1 or just below a scale boundary) holding E4M3 midpoints
    and their fp32 neighbours at every binade of the scaled block, subnormal steps included, and
    values just below / above 448 and 464 times the scale (saturation)."""
    mags = torch.tensor(E4M3.magnitudes, dtype=torch.float32)
    mids = (mags[1:] + mags[:-1]) / 2  # every tie of the ladder (exact in fp32)
    pts = torch.cat([mids, torch.nextafter(mids, mids * 2), torch.nextafter(mids, mids * 0), mags])
    pts = torch.cat([pts, torch.tensor([448.0, 449.0, 455.9, 456.0, 456.1, 463.9, 464.0])])
    blocks = []
    for e in (-8, -9, -20, -60, -118, -124, -125, -126, -127):  # 2**e: P~'s block scales, the last clamped
        vals = pts * 2.0**e
        vals = torch.cat([vals, torch.zeros((-vals.numel()) % 31)]).view(-1, 31)
        bmax = torch.full((vals.shape[0], 1), 464.0 * 2.0**e)
        if e == -8:
            bmax[:] = 1.0  # the row max: UOS puts 1 at 256 * 2**-8
        blocks.append(torch.cat([bmax, vals.clamp(max=bmax)], dim=1))
    x = torch.cat(blocks)
    return x[torch.randperm(x.shape[0], generator=g)]


@pytest.mark.parametrize("elem,rule", ELEM_RULES)
def test_p_cast_equals_fake_quantize(elem, rule, device):
    x = _nonneg_blocks(seed=2, below=2.0**100, elem=elem)  # elem_round's domain: C B stays finite
    # P~ values: the row max is 1 and the rest exp2 of anything down to -160 (subnormal, 0).
    g = torch.Generator().manual_seed(3)
    p = torch.exp2(-160 * torch.rand(2048, 32, generator=g) ** 3)
    p[::3, 0] = 1.0
    cases = [x, p]
    if elem == "e4m3":
        ties = _e4m3_ties(g)
        cases.append(torch.cat([ties, torch.zeros((-ties.shape[0]) % ROWS, 32)]))
    for vals in cases:
        _, _, out = _run(vals, rule, device, elem)
        assert torch.equal(out, fake_quantize(vals, axis=-1, rule=rule, elem=elem))


def test_p_cast_keeps_nan(device):
    """A NaN score (NaN P~) stays NaN through the saturation on both ladders, as the reference's cast."""
    x = torch.full((16, 32), 0.25)
    x[3, 5] = float("nan")
    for elem in ("e2m1", "e4m3"):
        out = torch.empty_like(x, device=device)
        two_e = torch.full((16,), 2.0**-8, device=device)
        _round_kernel[(1,)](x.to(device), two_e, out, elem)
        out = out.cpu()
        assert out[3, 5].isnan() and out.isnan().sum() == 1


@triton.jit
def _round_kernel(X, TwoE, Out, ELEM: tl.constexpr):
    offs = tl.arange(0, 16)[:, None] * 32 + tl.arange(0, 32)[None, :]
    two_e = tl.load(TwoE + tl.arange(0, 16))
    tl.store(Out + offs, elem_round(tl.load(X + offs), two_e[:, None], ELEM))


@triton.jit
def _inv_code_kernel(TwoE, Vals, Inv, Codes, N: tl.constexpr):
    two_e = tl.load(TwoE + tl.arange(0, N))
    tl.store(Inv + tl.arange(0, N), inv_exp2(two_e))
    offs = tl.arange(0, N)[:, None] * 8 + tl.arange(0, 8)[None, :]
    tl.store(Codes + offs, ladder_code(tl.load(Vals + offs) * inv_exp2(two_e)[:, None]))


def test_inv_exp2_every_block_scale(device):
    """`inv_exp2` is 1 / 2**e for every scale 2**-127 .. 2**126, and the attention kernel's P~ codes
    taken through it (ladder value r times 2**e, times the inverse) are r's code for each e up to
    2**125 (6 * 2**126 overflows), where 2**-127's values are subnormal."""
    e = torch.arange(-127, 127, dtype=torch.float64)
    two_e = torch.exp2(e).to(torch.float32)
    ladder = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
    vals = (ladder[None, :] * torch.exp2(e)[:, None]).to(torch.float32)
    n = 256
    pad = n - e.numel()
    two_e_p = torch.cat([two_e, torch.ones(pad)]).to(device)
    vals_p = torch.cat([vals, torch.zeros(pad, 8)]).to(device)
    inv = torch.empty(n, device=device)
    codes = torch.empty(n, 8, dtype=torch.int32, device=device)
    _inv_code_kernel[(1,)](two_e_p, vals_p, inv, codes, N=n)
    assert torch.equal(inv[: e.numel()].cpu(), torch.exp2(-e).to(torch.float32))
    assert torch.equal(
        codes[: e.numel() - 1].cpu(), torch.arange(8, dtype=torch.int32).expand(e.numel() - 1, 8)
    )


@triton.jit
def _dequant_kernel(Packed, Scales, Out, R: tl.constexpr, C: tl.constexpr):
    packed = tl.load(Packed + tl.arange(0, R)[:, None] * (C // 2) + tl.arange(0, C // 2)[None, :])
    scales = tl.load(Scales + tl.arange(0, R)[:, None] * (C // 32) + tl.arange(0, C // 32)[None, :])
    tl.store(
        Out + tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :], dequant_e2m1(packed, scales, R, C)
    )


def test_dequant_every_scale_byte(device):
    """`dequant_e2m1` (Q^ in the kernel's prologue, packed K^/V^ in its loop) equals
    `MXTensor.dequantize` for every E8M0 byte and every code: 2**-127 to 2**127 (one power-of-two
    factor would overflow above 2**113) and 255 = NaN."""
    from mxattention.formats.mx import MXTensor
    from mxattention.formats.packing import pack_uint4

    codes = torch.arange(16, dtype=torch.uint8).repeat(2)  # one block: each code twice
    packed = pack_uint4(codes).repeat(256, 1)
    scales = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(256, 1)
    ref = MXTensor(
        data=packed,
        scales=scales,
        shape=torch.Size((256, 32)),
        axis=-1,
        dtype=torch.float32,
        ladder=E2M1,
        rule=resolve_rule("ocp", E2M1),
        block_size=32,
    ).dequantize()
    out = torch.empty(256, 32, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter's numpy overflow to inf
        _dequant_kernel[(1,)](packed.to(device), scales.to(device), out, R=256, C=32)
    out = out.cpu()
    assert torch.equal(out.isnan(), ref.isnan()) and out[255].isnan().all()
    assert torch.equal(out[~out.isnan()], ref[~ref.isnan()])


@triton.jit
def _packed_cast_kernel(
    Y,
    Words,
    Scales,
    NORM: tl.constexpr,
    CEIL: tl.constexpr,
    Q_EXP: tl.constexpr,
    Q_MANT: tl.constexpr,
    FOLD_E_MAX: tl.constexpr,
    R: tl.constexpr,
    C: tl.constexpr,
):
    rows = tl.program_id(0) * R + tl.arange(0, R)
    y = tl.load(Y + rows[:, None] * C + tl.arange(0, C)[None, :])
    words, scales = cast_packed(tl.reshape(y, [R, C // 32, 32]), NORM, CEIL, Q_EXP, Q_MANT, False, FOLD_E_MAX)
    tl.store(Words + rows[:, None] * (C // 8) + tl.arange(0, C // 8)[None, :], words)
    tl.store(Scales + rows[:, None] * (C // 32) + tl.arange(0, C // 32)[None, :], scales)


def _tie_source(target: float, norm: float) -> float:
    """The largest fp32 y with fl32(y * norm) == target: y * norm lies above the target by as much
    as rounding allows (exactly on it when norm is a power of two)."""
    n32 = torch.tensor(norm, dtype=torch.float32)
    y = (torch.tensor(target, dtype=torch.float64) / n32.double()).float()
    down, up = torch.tensor(float("-inf")), torch.tensor(float("inf"))
    for _ in range(8):  # start a few ulps below, then walk up through every candidate
        y = torch.nextafter(y, down)
    hits = []
    for _ in range(24):
        if (y * n32).item() == target:
            hits.append(y.item())
        y = torch.nextafter(y, up)
    assert hits, f"no fp32 y rounds onto {target}"
    return max(hits)


def _fold_bound_tiles(norm: float, tile_rows: int) -> torch.Tensor:
    """Tiles of [tile_rows, 64] whose only nonzero block sits at one block exponent (OCP rule) next
    to a bound of `cast_packed`'s folded multiply, holding a value whose scaled magnitude is an
    E2M1 tie only when fl(y * norm) is formed first: 5 * 2**e (e = 15..23, the block max itself) and
    2**-127 beside a block max of 1.5 * 2**-123 (e = -125: x subnormal, p = 0.25)."""
    tiles = []
    for e in range(15, 24):
        t = torch.zeros(tile_rows, 64)
        t[0, :32] = _tie_source(5 * 2.0**e, norm)
        t[0, 1::2] *= -1
        tiles.append(t)
    for e in range(-127, -121):
        t = torch.zeros(tile_rows, 64)
        t[0, 32] = 1.5 * 2.0 ** (e + 2) / norm
        t[0, 33] = _tie_source(2.0 ** (e - 2), norm)
        t[0, 34] = -_tie_source(2.0 ** (e - 2), norm)
        tiles.append(t)
    return torch.cat(tiles)


@pytest.mark.parametrize("rule", ("ocp", "uos", 5.3, 1.5))
@pytest.mark.parametrize("norm", [1.0, 0.125, 1 / 128**0.5])
def test_cast_packed_equals_mx_quantize(rule, norm, device):
    """`cast_packed` on y equals mx_quantize(fl32(y * norm)) byte for byte, with the norm folded into
    the block scale: hard values at every binade (tiles mixing extreme and ordinary blocks), and
    tiles next to each bound of the fold (a fold one exponent too far changes a tie's rounding)."""
    from mxattention.formats.mx import mx_quantize
    from mxattention.kernels.prepass import fold_e_max

    rows = 16
    y = hard_values(E2M1, 64 * rows * 24, seed=7).view(-1, 64)
    y = torch.cat([y, _fold_bound_tiles(norm, rows)])
    rc = rule_constants(rule)
    words = torch.empty(y.shape[0], 8, dtype=torch.int32, device=device)
    scales = torch.empty(y.shape[0], 2, dtype=torch.int32, device=device)
    _packed_cast_kernel[(y.shape[0] // rows,)](
        y.to(device), words, scales, norm, rc.ceil, rc.q_exp, rc.q_mant, fold_e_max(norm), rows, 64
    )
    ref = mx_quantize(y * norm, axis=-1, rule=rule)
    assert torch.equal(words.cpu().view(torch.uint8), ref.data)
    assert torch.equal(scales.cpu().to(torch.uint8), ref.scales)


def _binade_edge_blocks() -> torch.Tensor:
    """Blocks [n, 32] whose block max is 7.25 * 2**e or 6 * 2**e (e from -120 to 120) and whose other
    elements sit at the edges of each binade of the scaled domain (0.25 to 8 times 2**e): the power
    of two itself, 1 to 3 ulps above it and 1 to 4 ulps below it, with both signs. `cast_packed`'s
    rounding takes its step from fl(a (1 - 2**-22)), which just above a power of two falls under it and
    just below the next one comes within 2**-21 of it: these are the values where it could go wrong."""
    edges = []
    for p in (0.25, 0.5, 1.0, 2.0, 4.0, 8.0):
        v = torch.tensor(p, dtype=torch.float32)
        up, down = v.clone(), v.clone()
        edges.append(v.clone())
        for _ in range(4):
            up = torch.nextafter(up, torch.tensor(float("inf")))
            down = torch.nextafter(down, torch.tensor(0.0))
            edges += [up.clone(), down.clone()]
    edges = torch.stack(edges)[:31]
    blocks = []
    for e in range(-120, 121, 7):
        for bmax in (7.25, 6.0):
            row = torch.cat([torch.tensor([bmax]), edges.clamp(max=bmax)]) * 2.0**e
            blocks += [row, -row]
    return torch.stack(blocks)


@pytest.mark.parametrize("rule", ("ocp", "uos"))
def test_cast_packed_binade_edges(rule, device):
    """`cast_packed` (no rotation: norm 1 and a power of two) equals mx_quantize on values a few ulps
    from every binade edge of the E2M1 ladder, at block scales across the exponent range."""
    from mxattention.formats.mx import mx_quantize
    from mxattention.kernels.prepass import fold_e_max

    y = _binade_edge_blocks()
    y = torch.cat([y, torch.zeros((-y.shape[0]) % 32, 32)]).view(-1, 64)
    rc = rule_constants(rule)
    for norm in (1.0, 0.5):
        words = torch.empty(y.shape[0], 8, dtype=torch.int32, device=device)
        scales = torch.empty(y.shape[0], 2, dtype=torch.int32, device=device)
        _packed_cast_kernel[(y.shape[0] // 16,)](
            y.to(device), words, scales, norm, rc.ceil, rc.q_exp, rc.q_mant, fold_e_max(norm), 16, 64
        )
        ref = mx_quantize(y * norm, axis=-1, rule=rule)
        assert torch.equal(words.cpu().view(torch.uint8), ref.data)
        assert torch.equal(scales.cpu().to(torch.uint8), ref.scales)


@triton.jit
def _e4m3_code_kernel(R, Codes, Scales, Out, Back, C: tl.constexpr, CD: tl.constexpr):
    offs = tl.arange(0, 256)[:, None] * C + tl.arange(0, C)[None, :]
    tl.store(Out + offs, elem_code(tl.load(R + offs), "e4m3"))
    offs_d = tl.arange(0, 256)[:, None] * CD + tl.arange(0, CD)[None, :]
    scales = tl.load(Scales + tl.arange(0, 256)[:, None] * (CD // 32) + tl.arange(0, CD // 32)[None, :])
    tl.store(Back + offs_d, dequant_e4m3(tl.load(Codes + offs_d), scales, 256, CD))


def test_e4m3_codes_and_dequant_every_scale_byte(device):
    """`elem_code` gives `ladder_codes`' E4M3 code of every ladder value (subnormals included), and
    `dequant_e4m3` (packed V^ on the bf16 path) equals `MXTensor.dequantize` for every code (both
    signs) under every E8M0 byte: 2**-127 to 2**127 (one factor would overflow above 2**7) and
    255 = NaN."""
    from mxattention.formats.mx import MXTensor
    from mxattention.formats.rounding import ladder_codes

    mags = torch.tensor(E4M3.magnitudes, dtype=torch.float32)  # 127 values: codes 0..126
    r = torch.cat([mags, torch.zeros(1)]).repeat(256, 1)
    codes = torch.cat([torch.arange(127), torch.arange(128, 255), torch.zeros(2)]).to(torch.uint8)
    codes = codes.repeat(256, 1)  # every code of both signs, in 8 blocks of 32 per row
    scales = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(256, 1).repeat(1, 8)
    got = torch.empty(256, 128, dtype=torch.int32, device=device)
    back = torch.empty(256, 256, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter's numpy overflow to inf
        _e4m3_code_kernel[(1,)](r.to(device), codes.to(device), scales.to(device), got, back, C=128, CD=256)
    assert torch.equal(got.cpu()[:, :127], ladder_codes(mags, E4M3).to(torch.int32).repeat(256, 1))
    ref = MXTensor(
        data=codes, scales=scales, shape=torch.Size((256, 256)), axis=-1, dtype=torch.float32,
        ladder=E4M3, rule=resolve_rule("ocp", E4M3), block_size=32,
    ).dequantize()  # fmt: skip
    back = back.cpu()
    assert torch.equal(back.isnan(), ref.isnan()) and back[255].isnan().all()
    assert torch.equal(back[~back.isnan()], ref[~ref.isnan()])
