"""Every MX target checked without a GPU: the attention kernel's `dot_scaled` path built offline
(`kernels.codegen`, Triton's bundled ptxas / AMD linker) for sm_100a, sm_120a and gfx950 with the
tiles `fused_attention` launches there, and its assembly read: block-scaled MMA instructions and
nothing decoded, one iteration's MMAs what its two products need (no copy computed twice), no
spills, no divisions in the loops. Also the matrix path and tiles chosen from the target Triton
reports (fake targets, no build). Table of the builds: benchmarks/results/codegen_mx_targets.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest
import torch

from mxattention.kernels import targets as tg
from mxattention.kernels.fused import launch_config
from mxattention.kernels.plan import default_matrix_path

from .helpers import once_per_run

# One build per MX target at the benchmark's head dim, plus a control the checks must flag: sm_90a
# has no FP4 MMA, so there Triton decodes dot_scaled's operands to bf16.
MX_BUILDS = ("sm_100a/d128", "sm_120a/d128", "gfx950/d128")
CONTROL = "sm_90a/d128/dot_scaled"
# The 8-bit presets (issue 16): MXFP8 P~V next to the E2M1 QK^T (mxattention-pv8) on every MX target,
# with the block-scaled MMA kinds each must take. Every product MXFP8 (mxfp8) takes only kinds pv8's
# P~V already takes on each target (UTCQMMA, QMMA E4M3, v_mfma_scale f8f6f4), so one target builds it
# for its E4M3 QK^T: sm_120a, whose register budget set its tiles (and which builds with Triton 3.6).
PV8_BUILDS = (
    *(f"{t}/d128/mxattention-pv8" for t in ("sm_100a", "sm_120a", "gfx950")),
    "sm_120a/d128/mxfp8",
)
PV8_MMA = {
    ("sm_100a", "mxattention-pv8"): {"UTCOMMA", "UTCQMMA"},  # kind::mxf4 and kind::mxf8f6f4
    ("sm_120a", "mxattention-pv8"): {"OMMA.SF.16864.F32.E2M1.E2M1", "QMMA.SF.16832.F32.E4M3.E4M3"},
    ("sm_120a", "mxfp8"): {"QMMA.SF.16832.F32.E4M3.E4M3"},
    ("gfx950", "mxattention-pv8"): {"v_mfma_scale_f32_32x32x64_f8f6f4"},  # FP4 and FP8 operands alike
}
# The warp-specialized Gluon forward on Hopper (`attention_fwd_hopper`): E2M1 P~ without Q smoothing,
# E4M3 P~ with Q smoothing's correction by wgmma. E4M3 P~ without smoothing is the smoothed build's
# path less the correction, so it has no build of its own.
GLUON_BUILDS = (
    "sm_90a/gluon",
    "sm_90a/mxattention-pv8-smooth/gluon",
)
NATIVE_MMA = {"sm_100a": "UTCOMMA", "sm_120a": "OMMA.SF.16864.F32.E2M1.E2M1", "gfx950": "v_mfma_scale_f32"}


@pytest.fixture(scope="module")
def builds(tmp_path_factory, request) -> dict[str, dict]:
    """Summaries of MX_BUILDS and CONTROL, built in one fresh process: the interpreter this test
    session uses cannot build, and an empty cache makes every run compile."""

    def build() -> list[dict]:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton_cache"))
        cmd = [
            sys.executable,
            "-m",
            "mxattention.kernels.codegen",
            *MX_BUILDS,
            *PV8_BUILDS,
            CONTROL,
            *GLUON_BUILDS,
        ]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stderr[-4000:]
        return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]

    rows = once_per_run(tmp_path_factory, "codegen_builds", build)
    report = request.config.pluginmanager.get_plugin("terminalreporter")
    for r in rows:
        line = (
            r.get("skip")
            or r.get("error")
            or (r.get("kernel") == "gluon" and json.dumps(r))
            or (
                f"{r['mma']} per loop {r['loop_mma']} (needs {r['mma_needed']}), {r['registers']} registers, "
                f"{r['spill_bytes']} B spilled, {r['shared']} B shared, tiles {r['block_m']}x{r['block_n']} "
                f"{r['num_warps']} warps {r['num_stages']} stages, {r['compile_s']} s"
            )
        )
        if report is not None:
            report.write_line(f"codegen {r['target']} {r['case']}: {line}")
    return {f"{r['target']} {r['case']}": r for r in rows}


def _build(builds: dict, spec: str) -> dict:
    from mxattention.kernels.codegen import parse_spec

    target, case = parse_spec(spec)
    row = builds[f"{target.name} {case.label}"]
    if row.get("skip"):
        pytest.skip(row["skip"])
    if case.kernel == "tl" and case.matrix_path is None and not tg.native_mx(target):
        pytest.skip(
            f"this Triton ({row['triton']}) takes the bf16 path on {target.name} (NATIVE_MX_MIN_TRITON)"
        )
    assert "error" not in row, f"{spec} does not build with Triton {row['triton']}: {row['error']}"
    return row


@pytest.mark.parametrize("spec", MX_BUILDS)
def test_native_block_scaled_mma_and_no_decode(builds, spec):
    r = _build(builds, spec)
    assert r["matrix_path"] == "dot_scaled", "the target's default path must be dot_scaled"
    want = NATIVE_MMA[r["target"]]
    assert r["mma"] and all(k.startswith(want) for k in r["mma"]), f"block-scaled MMAs: {r['mma']}"
    assert r["other_mma"] == {}, f"MMAs without block scales (decoded operands): {r['other_mma']}"
    assert r["decode_ops"] == 0, "E2M1 decoded to a wider type (TTGIR fp4_to_fp / PTX cvt e2m1)"


@pytest.mark.parametrize("spec", MX_BUILDS)
def test_mma_per_iteration_is_the_work(builds, spec):
    """Each loop iteration issues what QK^T and PV need per warp; more means a layout that
    replicates a product over warps (gfx950 with 8 waves of 32-row MFMAs over 128 rows did)."""
    r = _build(builds, spec)
    assert r["loop_mma"], "no MMA inside a loop"
    assert all(n == r["mma_needed"] for n in r["loop_mma"]), (r["loop_mma"], r["mma_needed"])


@pytest.mark.parametrize("spec", MX_BUILDS)
def test_no_spills_and_no_loop_divides(builds, spec):
    """The tiles of `targets.FWD_TILES` avoid spills on every MX target at D 128 (sm_120a spilled
    128 B at 128 x 8 warps), and P~'s codes take no division (`cast.inv_exp2`)."""
    r = _build(builds, spec)
    assert r["spill_bytes"] == 0 and r["spilled_registers"] == 0, (
        f"{r['registers']} registers, {r['spill_bytes']} B spilled with tiles {r['block_m']} rows, "
        f"{r['num_warps']} warps, {r['num_stages']} stages: retune targets.FWD_TILES for {r['target']}"
    )
    assert r["loop_divides"] == 0


@pytest.mark.parametrize("spec", PV8_BUILDS)
def test_8bit_presets_block_scaled_mma(builds, spec):
    """mxattention-pv8 on every MX target and mxfp8 on sm_120a: each product on its block-scaled MMA kind (an
    MXFP8 one needs twice the instructions of MXFP4 at K 32 on NVIDIA, the same on gfx950), one
    iteration issuing what the products need, nothing decoded, no spills, no divisions in the loops."""
    r = _build(builds, spec)
    kinds = PV8_MMA[(r["target"], spec.rsplit("/", 1)[1])]
    assert r["matrix_path"] == "dot_scaled"
    assert {k.removesuffix(".E8") for k in r["mma"]} == kinds and r["other_mma"] == {}, r["mma"]
    assert r["loop_mma"] and all(n == r["mma_needed"] for n in r["loop_mma"]), (
        r["loop_mma"],
        r["mma_needed"],
    )
    assert r["decode_ops"] == 0 and r["spill_bytes"] == 0 and r["spilled_registers"] == 0
    assert r["loop_divides"] == 0


def test_checks_flag_a_decoded_operand_path(builds):
    """The control (dot_scaled on sm_90a, decomposed by Triton) fails the native checks."""
    r = _build(builds, CONTROL)
    assert not r["mma"] and r["other_mma"], r
    assert r["decode_ops"] > 0


@pytest.mark.parametrize("spec", GLUON_BUILDS)
def test_gluon_forward_wgmmas_run_unserialized(builds, spec):
    """The Gluon sm_90a forward: each consumer's key loop issues the 8 + 8 wgmmas (m64n128k16) its
    64 rows x 128 keys x 128 dims need (one more with Q smoothing's correction by wgmma), ptxas keeps them asynchronous (no C7513 / C7515), nothing
    spills under the partitions' register budgets, and the loop stays near the `tl` kernel's ~1030
    SASS instructions per tile (benchmarks/NOTES.md), and the wait for P^_{j-1} V^_{j-1} stays after
    the softmax's exps (ptxas moved it before them until v13-late)."""
    r = _build(builds, spec)
    assert r["pv_wait_after_exps"] == [True, True], r
    corr_mma = spec.endswith("smooth/gluon")  # + the k16 wgmma that starts S with the correction
    assert r["hgmma_per_tile"] == [16 + corr_mma] * 2, r
    assert not r["wgmma_serialized"], "ptxas serialized the wgmmas (C7513 / C7515)"
    assert r["spill_bytes"] == 0, r
    assert max(r["instructions_per_tile"]) <= 1100, r["instructions_per_tile"]
    assert r["partition_registers"]["consumer"] in r["setmaxnreg"], r


def test_serialized_wgmmas_are_flagged():
    """ptxas's serialization notes (C7513 / C7514 / C7515) set wgmma_serialized; other infos do not."""
    from mxattention.kernels.codegen import wgmma_serialized

    note = (
        "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due "
        "to non wgmma instructions reading accumulator registers of  a wgmma between start and end of the "
        "pipeline stage in the function '_mx_attention_fwd_hopper_persistent_kernel'"
    )
    assert wgmma_serialized(note) and wgmma_serialized(note.replace("C7514", "C7515"))
    assert wgmma_serialized(note.replace("C7514", "C7513"))
    assert not wgmma_serialized("ptxas info    : Used 168 registers, used 3 barriers")
    assert not wgmma_serialized(note.replace("C7514", "C7512"))


# The matrix path and tiles from the target Triton reports (no build).


@pytest.mark.parametrize(
    ("target", "path"),
    [
        (tg.Target("cuda", 80), "bf16"),
        (tg.Target("cuda", 90), "bf16"),
        (tg.Target("cuda", 100), "dot_scaled"),
        (tg.Target("cuda", 103), "dot_scaled"),
        (tg.Target("cuda", 120), "dot_scaled"),
        (tg.Target("hip", "gfx942", 64), "bf16"),
        (tg.Target("hip", "gfx950", 64), "dot_scaled"),
        (None, "dot_scaled"),  # the interpreter
    ],
)
def test_matrix_path_for_target(monkeypatch, target, path):
    monkeypatch.setattr(tg, "triton_version", lambda: (3, 9))  # one that builds every MX target
    assert tg.matrix_path_for(target) == path


class _FakeDriver:
    def __init__(self, target):
        self.target = target

    def get_current_target(self):
        return self.target


@pytest.mark.parametrize(
    ("reported", "capability", "path"),
    [
        (("hip", "gfx950", 64), (9, 5), "dot_scaled"),  # MI350: ROCm torch says 9.5
        (("hip", "gfx942", 64), (9, 4), "bf16"),
        (("cuda", 90, 32), (9, 0), "bf16"),
        (("cuda", 120, 32), (12, 0), "dot_scaled"),
    ],
)
def test_default_matrix_path_asks_triton(monkeypatch, reported, capability, path):
    """`default_matrix_path` goes by the architecture Triton reports, not the capability number."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    from mxattention.kernels import _triton, plan

    for module in (_triton, plan):  # this session's kernels are interpreted; a GPU's are not
        monkeypatch.setattr(module, "kernels_interpreted", lambda: False)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.setattr(tg, "_TARGETS", {})
    monkeypatch.setattr(tg, "triton_version", lambda: (3, 9))
    monkeypatch.setattr(driver, "_active", _FakeDriver(GPUTarget(*reported)))
    assert default_matrix_path(torch.device("cuda", 0)) == path


def test_native_mx_needs_a_triton_that_builds_it(monkeypatch):
    """sm_100's dot_scaled kernel needs Triton >= 3.9 (3.6's compiler crashes on it); sm_120's and
    gfx950's build with 3.6 too."""
    monkeypatch.setattr(tg, "triton_version", lambda: (3, 6))
    assert [tg.matrix_path_for(t) for t in tg.MX_TARGETS] == ["bf16", "dot_scaled", "dot_scaled"]
    monkeypatch.setattr(tg, "triton_version", lambda: (3, 9))
    assert [tg.matrix_path_for(t) for t in tg.MX_TARGETS] == ["dot_scaled"] * 3


def test_tiles_per_target():
    """sm_90 and unknown targets keep the H200's tiles; the MX targets get their table rows, and
    explicit arguments win."""
    any128, any256 = (t for _, t in tg.FWD_TILES["any"])
    assert tg.fwd_tiles(tg.SM_90A, 128) == any128 == tg.FwdTiles(128, 8, 3)
    assert tg.fwd_tiles(tg.SM_90A, 256) == any256 == tg.FwdTiles(64, 4, 3)
    assert tg.fwd_tiles(None, 64) == any128
    assert tg.fwd_tiles(tg.Target("hip", "gfx942", 64), 128) == any128
    for family, rows in tg.FWD_TILES.items():
        for most, tiles in rows:
            target = {"sm_100": tg.SM_100A, "sm_120": tg.SM_120A, "gfx950": tg.GFX950}.get(family)
            if target is not None:
                assert tg.fwd_tiles(target, most) == tiles
    assert tg.fwd_tiles(tg.SM_120A, 128, block_m=32) == tg.FwdTiles(32, 4, 3)
    # What fused_attention launches with: the H200's bf16 path unchanged, gfx950's MFMA option kept.
    assert launch_config(tg.SM_90A, 128, 128) == (128, "bf16", "bf16", 8, 3, ())
    assert launch_config(tg.GFX950, 256, 256) == (
        64,
        "dot_scaled",
        "packed",
        4,
        3,
        (("matrix_instr_nonkdim", 16),),
    )
    assert tg.fwd_tiles(tg.SM_90A, 128, num_warps=4, num_stages=2) == tg.FwdTiles(128, 4, 2)
