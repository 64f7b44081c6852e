"""Source rules that keep the kernels building with the H200's Triton 3.6 (CI has only 3.9).

Triton 3.6 hands a string constexpr default of a jit function called from another jit function
over as a raw str ("'str' object has no attribute 'type'"), so such a default compiles here and
fails there. Launched kernels (`*_kernel`) are bound by the launcher and may keep defaults.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mxattention.kernels

KERNELS = Path(mxattention.kernels.__file__).parent


def _jit_functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
            yield node


def test_inner_jit_functions_have_no_string_defaults():
    bad = []
    for path in sorted(KERNELS.glob("*.py")):
        for fn in _jit_functions(ast.parse(path.read_text())):
            if fn.name.endswith("_kernel"):
                continue
            args = fn.args.args[len(fn.args.args) - len(fn.args.defaults) :]
            for arg, default in zip(args, fn.args.defaults, strict=True):
                if isinstance(default, ast.Constant) and isinstance(default.value, str):
                    bad.append(f"{path.name}:{fn.lineno} {fn.name}({arg.arg}={default.value!r})")
    assert not bad, "string constexpr defaults on inner jit functions (Triton 3.6 fails): " + ", ".join(bad)
