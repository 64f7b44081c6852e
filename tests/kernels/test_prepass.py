"""The pre-pass bytes equal `mx_quantize` (on the rotated values) bit for bit.

The rotation is the same fp32 butterfly network as `rotation.rotate`, so no fraction of elements is
allowed to differ: every test demands exact equality of codes and scale bytes.
"""

import pytest
import torch

from mxattention.formats.ladders import E2M1, E4M3
from mxattention.formats.mx import fake_quantize, mx_quantize
from mxattention.kernels.prepass import prepass_qk, prepass_v
from mxattention.rotation import rotate
from tests.formats.hard_values import hard_values

RULES = ("ocp", "tfs", "uos", 5.3, 7.0000001)


def _outliers(shape, g):
    x = torch.randn(shape, generator=g)
    x = x * torch.exp(2 * torch.randn(shape[-1], generator=g))  # channel outliers
    x[..., 3, :7] = 0.0
    x[..., 5, :] = 0.0
    return x


def _check_qk(x, rule, hadamard, device):
    codes, scales = prepass_qk(x.to(device), rule, hadamard=hadamard)
    ref = mx_quantize(rotate(x.float()) if hadamard else x, axis=-1, rule=rule)
    n, nb = x.shape[-2], ref.scales.shape[-1]
    assert torch.equal(codes[..., :n, : nb * 16].cpu(), ref.data)
    assert torch.equal(scales[..., :n, :nb].cpu(), ref.scales)
    assert (codes[..., n:, :] == 0).all() and (scales[..., n:, :] == 127).all()  # padding rows
    assert (codes[..., nb * 16 :] == 0).all() and (scales[..., nb:] == 127).all()  # padding cols


def _covering(ds, rules, hadamards=(False, True)):
    """(d, hadamard, rule) runs: every head dim with and without rotation, the rules taken in turn, so
    every rule meets both rotation settings and several head dims (the rule only sets the scale
    constants: its bit-for-bit check on every hard value is test_qk_hard_values / test_v_*)."""
    runs = [(d, h) for d in ds for h in hadamards]
    return [(d, h, rules[i % len(rules)]) for i, (d, h) in enumerate(runs)]


@pytest.mark.parametrize("d,hadamard,rule", _covering([32, 64, 80, 128, 160, 256], RULES))
def test_qk_bytes_equal_mx_quantize(rule, hadamard, d, device):
    g = torch.Generator().manual_seed(d * 7 + hadamard)
    _check_qk(_outliers((2, 2, 37, d), g), rule, hadamard, device)


@pytest.mark.parametrize("rule", RULES)
def test_qk_hard_values(rule, device):
    # Ties, powers of two, boundaries q * 2**k and neighbours, subnormals, zero blocks, huge blocks.
    x = hard_values(E2M1, 64 * 128, seed=3).view(1, 1, 64, 128)
    _check_qk(x, rule, False, device)


def test_qk_nonfinite_blocks(device):
    x = torch.randn(1, 1, 4, 64)
    x[0, 0, 0, 3] = float("nan")
    x[0, 0, 1, 40] = float("inf")
    x[0, 0, 2, 0] = -float("inf")
    _check_qk(x, "uos", False, device)


@pytest.mark.filterwarnings(
    "ignore::RuntimeWarning"
)  # the interpreter's butterflies overflow to Inf, as torch's
@pytest.mark.parametrize("rule", ("ocp", "uos", 5.3))
@pytest.mark.parametrize("d", [64, 128])
def test_qk_rotated_extreme_scales(rule, d, device):
    """The packed cast folds 1/sqrt(b) and 2**-104 into one multiply by the block scale, exact only
    for block exponents in [-124, fold_e_max(norm) - 104] (cast.cast_packed); a tile with any block
    outside takes the multiplies one at a time. One head (one tile) per magnitude range, every row
    its own power of two, so blocks land on both sides of each bound, and one head that stays inside
    (the bounds themselves: tests/kernels/test_cast.py::test_cast_packed_equals_mx_quantize)."""
    g = torch.Generator().manual_seed(d)
    x = torch.randn(1, 5, 64, d, generator=g)
    ranges = {1: (10, 30), 2: (-150, -110), 3: (100, 127), 4: (-130, 127)}  # head 0: in range
    for head, (lo, hi) in ranges.items():
        k = torch.randint(lo, hi + 1, (64, 1), generator=g).float()
        x[0, head] = x[0, head] * torch.exp2(k)
    x[0, 2, :3] = torch.tensor([1e-45, -3e-44, 2e-40])[:, None]  # subnormal inputs
    _check_qk(x, rule, True, device)
    # Mixed signs of zero and one block with a NaN next to extreme rows.
    x[0, 4, 7] = -0.0
    x[0, 4, 8, 5] = float("nan")
    _check_qk(x, rule, True, device)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_qk_half_inputs(dtype, device):
    g = torch.Generator().manual_seed(1)
    _check_qk(_outliers((1, 2, 50, 64), g).to(dtype), "uos", True, device)


@pytest.mark.parametrize("d,rule", [(d, RULES[i]) for i, d in enumerate([32, 64, 80, 128, 256])])
def test_v_bytes_equal_mx_quantize(rule, d, device):
    g = torch.Generator().manual_seed(d)
    v = _outliers((1, 2, 100, d), g)
    v[0, 0, :40] = hard_values(E2M1, 40 * d, seed=d).view(40, d)
    codes, scales = prepass_v(v.to(device), rule)
    ref = mx_quantize(v, axis=-2, rule=rule)
    nb = ref.scales.shape[-1]
    assert torch.equal(codes[:, :, :d, : nb * 16].cpu(), ref.data)
    assert torch.equal(scales[:, :, :d, :nb].cpu(), ref.scales)
    assert (codes[:, :, :, nb * 16 :] == 0).all() and (scales[:, :, :, nb:] == 127).all()


@pytest.mark.parametrize("d,hadamard,rule", _covering([32, 80, 128, 256], ("ocp", "uos", 500.0)))
def test_qk_e4m3_equals_mx_quantize(rule, hadamard, d, device):
    """The MXFP8 Q^ / K^ pass (elem="e4m3"): code bytes and scales of mx_quantize(rotate(x)), padding
    rows and columns zero, and the bf16 values of fake_quantize (blocks under 1e-30 left out)."""
    g = torch.Generator().manual_seed(d * 3 + hadamard)
    x = _outliers((1, 2, 37, d), g)
    x[0, 0, :8] = hard_values(E4M3, 8 * d, seed=d).view(8, d)
    x[0, 1, 9, 3] = float("nan")
    codes, scales = prepass_qk(x.to(device), rule, hadamard=hadamard, elem="e4m3")
    xr = rotate(x) if hadamard else x
    ref = mx_quantize(xr, axis=-1, rule=rule, elem="e4m3")
    nb = ref.scales.shape[-1]
    assert torch.equal(codes[..., :37, : nb * 32].cpu(), ref.data)
    assert torch.equal(scales[..., :37, :nb].cpu(), ref.scales)
    assert (codes[..., 37:, :] == 0).all() and (scales[..., 37:, :] == 127).all()
    assert (codes[..., nb * 32 :] == 0).all() and (scales[..., nb:] == 127).all()
    x = torch.where(x.abs() > 1e-30, x, 0.0)
    y = prepass_qk(x.to(device), rule, hadamard=hadamard, elem="e4m3", out_bf16=True)[..., :37, :d]
    want = fake_quantize(rotate(x) if hadamard else x, -1, rule=rule, elem="e4m3")
    y = y.float().cpu()
    assert torch.equal(y.isnan(), want.isnan()) and torch.equal(y[~y.isnan()], want[~want.isnan()])


@pytest.mark.parametrize("d,rule", [(64, "ocp"), (80, "uos"), (256, 500.0)])
def test_v_e4m3_equals_mx_quantize(rule, d, device):
    """The MXFP8 V^ pass (elem="e4m3"): one code byte per key equal to mx_quantize's, and the bf16
    values equal fake_quantize's (blocks scaled below 2**-124, not bf16 numbers, left out: 1e-30)."""
    g = torch.Generator().manual_seed(d + 1)
    v = _outliers((1, 2, 100, d), g)
    v[0, 0, :40] = hard_values(E4M3, 40 * d, seed=d).view(40, d)
    codes, scales = prepass_v(v.to(device), rule, elem="e4m3")
    ref = mx_quantize(v, axis=-2, rule=rule, elem="e4m3")
    nb = ref.scales.shape[-1]
    assert torch.equal(codes[:, :, :d, : nb * 32].cpu(), ref.data)
    assert torch.equal(scales[:, :, :d, :nb].cpu(), ref.scales)
    assert (codes[:, :, :, nb * 32 :] == 0).all() and (scales[:, :, :, nb:] == 127).all()
    v = torch.where(v.abs() > 1e-30, v, 0.0)
    y = prepass_v(v.to(device), rule, elem="e4m3", out_bf16=True)[..., :100, :d].float().cpu()
    want = fake_quantize(v, -2, rule=rule, elem="e4m3")
    assert torch.equal(y.isnan(), want.isnan())
    assert torch.equal(y[~y.isnan()], want[~want.isnan()])


@pytest.mark.parametrize("layout", ["blhd", "strided_d"])
def test_strided_inputs(layout, device):
    """Views as models hand them over ([B, L, H, D] transposed; every other column) read correctly."""
    g = torch.Generator().manual_seed(11)
    chan = torch.exp(2 * torch.randn(128, generator=g))
    if layout == "blhd":
        base = torch.randn(2, 70, 3, 64, generator=g) * chan[:64]
        x, dev = base.transpose(1, 2), base.to(device).transpose(1, 2)
    else:
        base = torch.randn(2, 3, 70, 128, generator=g) * chan
        x, dev = base[..., ::2], base.to(device)[..., ::2]
    assert dev.stride() == x.stride() and not x.is_contiguous()
    codes, scales = prepass_qk(dev, "uos", hadamard=True)
    ref = mx_quantize(rotate(x.contiguous()), axis=-1, rule="uos")
    assert torch.equal(codes[..., :70, :32].cpu(), ref.data) and torch.equal(
        scales[..., :70, :2].cpu(), ref.scales
    )
    codes, scales = prepass_v(dev, "ocp")
    ref = mx_quantize(x.contiguous(), axis=-2, rule="ocp")
    assert torch.equal(codes[..., :64, :48].cpu(), ref.data)  # 70 keys padded to 3 blocks
    assert torch.equal(scales[..., :64, :3].cpu(), ref.scales)


@pytest.mark.parametrize("hadamard", [False, True])
def test_bf16_outputs_equal_fake_quantize(hadamard, device):
    """out_bf16 writes fake_quantize's values (exact in bf16). Triton 3.9's interpreter flushes bf16
    subnormals, so blocks with scales below 2**-120 are left out here (the GPU checks them)."""
    g = torch.Generator().manual_seed(5)
    x = _outliers((1, 2, 70, 128), g)
    x[0, 0, :10] = hard_values(E2M1, 10 * 128, seed=5).view(10, 128).clamp(-1e30, 1e30)
    if device == "cpu":
        x = torch.where(x.abs() > 1e-30, x, 0.0)
    y = prepass_qk(x.to(device), "uos", hadamard=hadamard, out_bf16=True)
    want = fake_quantize(rotate(x) if hadamard else x, -1, rule="uos")
    assert torch.equal(y[..., :70, :].float().cpu(), want)
    assert (y[..., 70:, :] == 0).all()
    yv = prepass_v(x.to(device), "ocp", out_bf16=True)
    assert torch.equal(yv[..., :70, :].float().cpu(), fake_quantize(x, -2, rule="ocp"))


def test_bf16_outputs_nonfinite_blocks(device):
    """A block holding NaN or Inf dequantizes to NaN, as fake_quantize; other blocks are untouched."""
    x = torch.randn(1, 1, 64, 64)
    x[0, 0, 0, 3] = float("nan")
    x[0, 0, 1, 40] = float("inf")
    x[0, 0, 33, 5] = -float("inf")  # V: keys 32..63 of column 5
    y = prepass_qk(x.to(device), "uos", hadamard=False, out_bf16=True)[..., :64, :].float().cpu()
    assert torch.equal(y.isnan(), fake_quantize(x, -1, rule="uos").isnan())
    assert y.isnan().sum() == 3 * 32
    want = fake_quantize(x, -1, rule="uos")
    assert torch.equal(y[~y.isnan()], want[~want.isnan()])
    yv = prepass_v(x.to(device), "ocp", out_bf16=True)[..., :64, :].float().cpu()
    wv = fake_quantize(x, -2, rule="ocp")
    assert torch.equal(yv.isnan(), wv.isnan()) and yv.isnan().sum() == 3 * 32
    assert torch.equal(yv[~yv.isnan()], wv[~wv.isnan()])


def test_v_bf16_warps_follow_the_grid(monkeypatch):
    """The bf16 V^ pass takes 2 warps per program when its grid has fewer than V_SMALL_GRID_PER_SM
    programs per SM (short keys), 1 otherwise; on a CUDA device only (faked here)."""
    from types import SimpleNamespace

    from mxattention.kernels import prepass

    launches = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((grid, kwargs["num_warps"]))

    monkeypatch.setattr(prepass, "_v_prepass_kernel", Recorder())
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda d: SimpleNamespace(multi_processor_count=132)
    )
    for n in (512, 4096):
        prepass_v(torch.empty(1, 40, n, 128, dtype=torch.bfloat16), "uos", out_bf16=True)
    # 40 x 16 = 640 programs < 8 x 132; 40 x 128 = 5120 are plenty.
    assert launches == [((16, 40), 2), ((128, 40), 1)]
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: False))
    prepass_v(torch.empty(1, 40, 512, 128, dtype=torch.bfloat16), "uos", out_bf16=True)
    assert launches[-1] == ((16, 40), 1)
