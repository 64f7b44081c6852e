"""The attention kernel built offline for every MX target (no GPU), one row per build.

    python benchmarks/codegen_table.py [--builds sm_100a/d128 ...] [--out benchmarks/results]

Each build is `mxattention.kernels.codegen.summarize`: the launch `fused_attention` makes on that
target (its tiles from `kernels.targets.FWD_TILES`), compiled by Triton's bundled toolchain, and
its assembly read (SASS on CUDA, AMDGCN on ROCm). Default builds: sm_100a, sm_120a and gfx950 at
head dims 64, 128, 256, causal and not, and the 8-bit presets (mxattention-pv8, mxfp8) at 128; the
H200's sm_90a bf16 path for reference, and sm_90a dot_scaled (Triton decodes it to bf16: what a
non-native build looks like). Run without
TRITON_INTERPRET=1. Writes `codegen_mx_targets.json` and `.md`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from dataclasses import asdict
from pathlib import Path

from mxattention.kernels import codegen

MX_TARGETS = ("sm_100a", "sm_120a", "gfx950")
DEFAULT_BUILDS = (
    [f"{t}/d{d}{c}" for t in MX_TARGETS for d in (64, 128, 256) for c in ("", "/causal")]
    + [f"{t}/d128/{m}" for t in MX_TARGETS for m in ("mxattention-pv8", "mxfp8")]
    + ["sm_90a/d128", "sm_90a/d128/causal", "sm_90a/d128/dot_scaled"]
)


def _row(s: dict) -> str:
    opts = "".join(f", {k}={v}" for k, v in s["options"].items())
    tiles = f"{s['block_m']}x{s['block_n']}, {s['num_warps']} w, {s['num_stages']} st{opts}"
    mma = ", ".join(f"{n} {k}" for k, n in {**s["mma"], **s["other_mma"]}.items())
    loop = "/".join(map(str, s["loop_mma"])) or "-"
    per_iter = f"{loop} (needs {s['mma_needed']})" if s["mma"] else "-"
    spill = f"{s['spill_bytes']} B" + (f", {s['spilled_registers']} regs" if s["spilled_registers"] else "")
    native = "yes" if s["mma"] and not s["other_mma"] and not s["decode_ops"] else "no"
    if s["matrix_path"] == "bf16":
        native = "- (bf16 path)"
    cells = [
        s["target"], s["case"], s["matrix_path"], tiles, mma, native, per_iter, s["decode_ops"],
        s["registers"], spill, s["shared"], s["loop_divides"], s["instructions"], s["compile_s"],
    ]  # fmt: skip
    return "| " + " | ".join(map(str, cells)) + " |"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--builds", nargs="+", default=DEFAULT_BUILDS, help="TARGET[/dD][/causal][/bf16|/dot_scaled]"
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        p.error("unset TRITON_INTERPRET: the builds need compiled kernels")
    import triton

    rows, skipped = [], []
    for spec in args.builds:
        target, case = codegen.parse_spec(spec)
        why = codegen.toolchain_missing(target)
        if why:
            skipped.append(f"{spec}: {why}")
            continue
        rows.append(asdict(codegen.summarize(target, case)))
        print(_row(rows[-1]), flush=True)
    cmd = "python benchmarks/codegen_table.py" + (
        "" if args.builds == DEFAULT_BUILDS else " --builds " + " ".join(args.builds)
    )
    meta = {
        "triton": triton.__version__,
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (offline builds, no GPU)",
        "python": sys.version.split()[0],
        "command": cmd,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "codegen_mx_targets.json").write_text(
        json.dumps({**meta, "rows": rows, "skipped": skipped}, indent=1)
    )
    lines = [
        f"# The attention kernel built offline per target (Triton {meta['triton']}, {meta['date']})",
        "",
        f"Command: `{cmd}` on {meta['machine']}. One build per row: the launch `fused_attention` makes",
        "on that target (tiles from `kernels.targets.FWD_TILES`; 1 x 2 heads x 1024 tokens, the",
        "`mxattention` method), compiled with Triton's bundled ptxas / AMD toolchain. MMAs are counted",
        "in the SASS (CUDA) or AMDGCN (ROCm); per iteration = one loop iteration in one warp's",
        "instruction stream (tcgen05 MMAs are issued once per program), for each loop (full tiles,",
        "masked tail), against what QK^T and PV need. Native = block-scaled MMAs only and no E2M1",
        "decode (TTGIR fp4_to_fp / upcast_mxfp, PTX cvt e2m1). Registers: per thread (CUDA), VGPRs",
        "with AGPRs per lane (ROCm). Spills: ptxas spill stores (CUDA), scratch bytes and spilled",
        "registers (ROCm). Divides: fp32 divisions inside the loops. Compile s: wall time of the",
        "build on this machine (on a shared one it varies 2-3x with the load).",
        "",
        "| target | case | path | tiles | MMA instructions | native | MMAs per iteration | decode ops "
        "| registers | spills | shared B | loop divides | instructions | compile s |",
        "| --- | --- | --- | --- | --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
        *map(_row, rows),
    ]
    if skipped:
        lines += ["", "Skipped: " + "; ".join(skipped)]
    (args.out / "codegen_mx_targets.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
