"""The call in one place: the public entries, the torch custom ops, the routing data and the errors.

Exposes `scaled_dot_product_attention` and `varlen_attention` (`entry`), `ReferenceFallbackWarning`,
`InferenceOnlyError`, `FallbackError`, `FallbackWarning` and `REASONS` (`errors`). Inside: `call`
(the custom ops `mxattention::sdpa`, `::routed_sdpa`, `::varlen`, `::no_backward`; none calls
another), `route` (`Router`: what a patch or framework backend hands the op, decided inside it),
`memo` (a plain eager call like one served before replays that call's program from its arguments).

Sits above `attention` and `kernels` (the planner through `call`, the plan cache's programs through
`memo`);
`integrations` sits above it. A call enters at an entry (or a patch / backend); one like a call
served before replays its program (`memo`); any other is checked once by
`attention.inputs.sdpa_problem` (an error, or a fallback reason of `REASONS`), makes one op call,
which gets the plan (or the reason the kernels do not serve it) and runs.
"""

from mxattention.ops.entry import scaled_dot_product_attention, varlen_attention
from mxattention.ops.errors import (
    REASONS,
    FallbackError,
    FallbackWarning,
    InferenceOnlyError,
    ReferenceFallbackWarning,
)

__all__ = [
    "REASONS",
    "FallbackError",
    "FallbackWarning",
    "InferenceOnlyError",
    "ReferenceFallbackWarning",
    "scaled_dot_product_attention",
    "varlen_attention",
]
