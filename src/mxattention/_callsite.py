"""Internal: warnings attributed to the user's line, not to torch's or mxattention's internals.

Exposes `warn_at_call_site(message, category)`: `warnings.warn` with the stack level of the first
frame outside mxattention, torch, diffusers and transformers, and outside generated code (compiled
graphs, whose file names start with "<", and Inductor's output code). A warning issued while a model
runs (eagerly, or inside a compiled graph at run time) so points at the line that called the model or
the attention function, and Python's "once per location" filter applies to that line.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings

_LIBRARIES = ("mxattention", "torch", "diffusers", "transformers")


def _library_dirs() -> tuple[str, ...]:
    dirs = []
    for name in _LIBRARIES:
        spec = importlib.util.find_spec(name) if name not in sys.modules else sys.modules[name].__spec__
        for loc in (spec.submodule_search_locations or []) if spec is not None else []:
            dirs.append(os.path.join(os.path.realpath(loc), ""))
            dirs.append(os.path.join(os.path.abspath(loc), ""))
    if "torch._inductor" in sys.modules:  # Inductor's generated wrapper code
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        dirs.append(os.path.join(os.path.abspath(cache_dir()), ""))
    return tuple(dict.fromkeys(dirs))


def _internal(filename: str, dirs: tuple[str, ...]) -> bool:
    return filename.startswith("<") or filename.startswith(dirs)


def warn_at_call_site(message: str, category: type[Warning]) -> None:
    """`warnings.warn(message, category)` attributed to the first frame outside the libraries."""
    dirs = _library_dirs()
    frame, level = sys._getframe(0), 1
    while frame is not None and _internal(frame.f_code.co_filename, dirs):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
