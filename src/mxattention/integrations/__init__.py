"""Plugging mxattention into models: torch SDPA patching, a diffusers backend, hybrid precision.

Exposes `patch_sdpa`, `enable`, `disable`, `stats`, `SdpaPatch` (sdpa_patch), `PrecisionPolicy`,
`AttentionSite`, `current_site`, `PolicyRuleWarning` (policy), `FallbackError`, `FallbackWarning`
(`mxattention.ops`) and, importing diffusers on first use, `register_diffusers_backend`,
`register_preset_backends`, `backend_name`, `backend_stats`, `register_diffusers_varlen_backend`,
`varlen_backend_stats`, `reset_varlen_backend_stats` (diffusers_backend) and, importing xfuser on first
use, `register_xdit_backend`, `xdit_backend_stats` (xdit). Imports `attention` and `ops` (the entries,
the custom ops, `Router`, the errors) only: every call goes through one op of `mxattention.ops`.
"""

from __future__ import annotations

from typing import Any

from mxattention.integrations.policy import AttentionSite, PolicyRuleWarning, PrecisionPolicy, current_site
from mxattention.integrations.sdpa_patch import SdpaPatch, disable, enable, patch_sdpa, stats
from mxattention.ops.errors import FallbackError, FallbackWarning

_DIFFUSERS = (
    "register_diffusers_backend",
    "register_preset_backends",
    "backend_name",
    "backend_stats",
    "register_diffusers_varlen_backend",
    "varlen_backend_stats",
    "reset_varlen_backend_stats",
)
_XDIT = ("register_xdit_backend", "xdit_backend_stats")

__all__ = [
    "AttentionSite",
    "FallbackError",
    "FallbackWarning",
    "PolicyRuleWarning",
    "PrecisionPolicy",
    "SdpaPatch",
    "current_site",
    "disable",
    "enable",
    "patch_sdpa",
    "stats",
    *_DIFFUSERS,
    *_XDIT,
]


def __getattr__(name: str) -> Any:
    # diffusers is optional and slow to import: load the backend module only when asked for.
    if name in _DIFFUSERS:
        from mxattention.integrations import diffusers_backend

        return getattr(diffusers_backend, name)
    if name in _XDIT:
        from mxattention.integrations import xdit

        return getattr(xdit, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
