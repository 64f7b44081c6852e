"""Internal: what the framework integrations share beside the op (`mxattention.ops`).

Exposes `NamedBackend` (a `Router` registered under a framework's name), `check_policy` and
`add_enum_member` (a member added to a framework's live backend Enum); re-exports `original_sdpa`
(torch's function as found when mxattention was first imported, `ops.route`).
"""

from __future__ import annotations

from typing import Any

from mxattention.attention.config import AttentionConfig
from mxattention.integrations.policy import PrecisionPolicy
from mxattention.ops.route import Router, original_sdpa

__all__ = ["NamedBackend", "add_enum_member", "check_policy", "original_sdpa"]


def check_policy(policy: object) -> None:
    """TypeError unless `policy` is a PrecisionPolicy or None."""
    if policy is not None and not isinstance(policy, PrecisionPolicy):
        raise TypeError(f"policy must be a PrecisionPolicy or None, got {type(policy).__name__}")


class NamedBackend(Router):
    """A backend registered under a name by a framework (diffusers, xDiT): its method, policy,
    options and counts; the calls it does not quantize run torch's own SDPA. `varlen`: a diffusers
    varlen backend (each batch row a sequence of `varlen_attention`; no policy)."""

    def __init__(
        self,
        name: str,
        method: AttentionConfig,
        policy: PrecisionPolicy | None,
        *,
        label: str,
        strict: bool = False,
        autograd: str = "error",
        varlen: bool = False,
    ) -> None:
        check_policy(policy)
        super().__init__(method, policy, strict=strict, autograd=autograd)
        self.name = name
        self.label = label
        self.varlen = varlen


def add_enum_member(enum_cls: type, attr: str, value: Any, member: Any) -> Any:
    """Add `member` (made by the enum's own base: `str.__new__`, `object.__new__`) to the live Enum
    `enum_cls` as `enum_cls.<attr>` with value `value`, the way the Enum machinery records its own
    members (frameworks key their attention registries by such enums; both backends extend one)."""
    member._name_ = attr
    member._value_ = value
    member.__objclass__ = enum_cls
    if hasattr(enum_cls, "_add_member_"):  # Python >= 3.13 keeps the member bookkeeping itself
        enum_cls._add_member_(attr, member)
    else:
        member._sort_order_ = len(enum_cls._member_names_)
        enum_cls._member_map_[attr] = member
        enum_cls._member_names_.append(attr)
        type.__setattr__(enum_cls, attr, member)
    enum_cls._value2member_map_[value] = member
    return member
