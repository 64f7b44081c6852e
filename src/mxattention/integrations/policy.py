"""Hybrid precision: which attention calls of a model stay in high precision.

Exposes `PrecisionPolicy`, `AttentionSite`, `current_site`, `PolicyHandle` and `PolicyRuleWarning`
(a rule that can never match: warned at `attach` for blocks and module patterns, for steps once a
run's length is known). The paper runs Wan2.2 with transformer block 0 and the final 2 of 40
denoising steps in high precision (`PrecisionPolicy.wan22()`); HunyuanVideo fully 4-bit (no policy).

A call is placed by three facts, gathered by the hooks `PrecisionPolicy.attach(model)` installs:

- step: a forward pre-hook on the transformer reads its `timestep` input (the max over the batch and
  tokens, so classifier-free guidance, whether batched or run as two calls with the same t, and
  Wan2.2 TI2V's per-token timesteps count once). A new, lower t is the next step; a higher t than the
  last starts a new generation at step 0. Models called without a timestep count one step per call.
  Samplers that evaluate the model at several t per step (Heun) should attach with
  `steps="callback"` and pass `policy.step_callback` as the pipeline's `callback_on_step_end`.
- layer: pre-/post-hooks on every block of the model's top-level block lists (direct `ModuleList`
  children whose name contains "block") and on the attention modules inside keep a thread-local stack
  of `AttentionSite`s. Blocks are numbered across those lists in registration order (Flux and
  HunyuanVideo: double-stream blocks first, then single-stream ones).
- kind: "cross" when the attention module says so (`is_cross_attention`, as diffusers' `Attention`
  and `WanAttention` set it), otherwise when the query and key lengths differ; else "self". Joint
  text + video attention (HunyuanVideo, Flux) is therefore "self".

Under torch.compile the hooks are traced with the model. A call's site is then a fact of the graph:
the block hooks push their site on a trace-time stack and the traced attention call passes the
site's index to its op as a constant (`traced_site()`). The step is a run-time fact: the model's
pre-hook calls the custom op `mxattention::policy_model_call` (the step tracker, reading the timestep
tensor at run time), which returns the new step as a 0-d tensor that every attention op of that
forward takes as an input (`traced_step(policy)`), so no compiler can run the attention before the
step update (Inductor does not keep side-effect-only ops in program order; data it must).
"""

from __future__ import annotations

import fnmatch
import inspect
import itertools
import threading
import weakref
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch._library.effects import EffectType

from mxattention._callsite import warn_at_call_site
from mxattention.attention.config import AttentionConfig, get_method
from mxattention.ops.route import THREAD_SITE

KINDS = ("self", "cross")


class PolicyRuleWarning(UserWarning):
    """A `PrecisionPolicy` rule can never match the model or run it is used on (a block past the
    model's blocks, a module pattern matching none of its sites, a step past the run's steps)."""


NATIVE = "native"
_UNSET: Any = object()

_local = threading.local()


@dataclass(frozen=True)
class AttentionSite:
    """Where an attention call comes from: module name, global block index, cross flag (None: unknown)."""

    name: str
    block: int | None = None
    cross: bool | None = None


def _site_stack() -> list[AttentionSite]:
    stack = getattr(_local, "sites", None)
    if stack is None:
        stack = _local.sites = []
    return stack


def current_site() -> AttentionSite | None:
    """The innermost hooked block / attention module running in this thread, if any."""
    stack = _site_stack()
    return stack[-1] if stack else None


# Hooked sites by index: the compiled hooks name their site by this int (a graph constant).
_sites: list[AttentionSite] = []
_sites_lock = threading.Lock()


def _site_index(site: AttentionSite) -> int:
    with _sites_lock:
        _sites.append(site)
        return len(_sites) - 1


def _enter(index: int) -> None:
    _site_stack().append(_sites[index])


def _leave(index: int) -> None:
    stack = _site_stack()
    if stack and stack[-1] is _sites[index]:
        stack.pop()


# Site indices pushed by the hooks while Dynamo traces them: what `current_site` is at that point of
# the graph, passed to the attention op as a constant. (Dynamo replays the list's mutations when it
# leaves a frame, so a graph break inside a block leaves the real list as the trace saw it.)
_trace_sites: list[int] = []

NO_SITE = -2  # THREAD_SITE (-1, `ops.route`): an eager call, which reads this thread's site


def traced_site() -> int:
    """While Dynamo traces: the index of the innermost hooked site, or NO_SITE."""
    return _trace_sites[-1] if _trace_sites else NO_SITE


def site_of(index: int) -> AttentionSite | None:
    """The site an op's `site` argument names: THREAD_SITE (eager calls) reads this thread's stack."""
    return current_site() if index == THREAD_SITE else None if index < 0 else _sites[index]


def traced_step(policy: PrecisionPolicy | None) -> torch.Tensor | None:
    """While Dynamo traces: the step tensor the policy's model pre-hook produced in this forward."""
    return None if policy is None else policy._state.trace_step


_states: weakref.WeakValueDictionary[str, _PolicyState] = weakref.WeakValueDictionary()
_state_ids = itertools.count()


class _PolicyState:
    """What a policy has seen: the step tracker and the call counts. Shared by every attached model."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.token = f"policy:{next(_state_ids)}"  # names this state in the compiled hooks' op calls
        _states[self.token] = self
        self.step: int | None = None
        self.trace_step: torch.Tensor | None = None  # traced hooks: the step op's output (see traced_step)
        self.last_t: float | None = None
        self.runs = 0
        self.model_calls = 0
        self.by_callback = False
        # (step, block, site name, kind, high precision) -> calls
        self.counts: Counter[tuple[int | None, int | None, str, str, bool]] = Counter()
        self.rule_steps: frozenset[int] = frozenset()  # the policy's `steps`, for `_unreached`
        self.warned: set[str] = set()

    def _unreached(self, steps: int, sentence: str) -> None:
        """Warn once per message about the step rules at or past `steps`, the length of a run
        (called under the lock; `sentence` says where the length comes from)."""
        late = sorted(s for s in self.rule_steps if s >= steps)
        text = f"PrecisionPolicy steps {_ranges(late)} {sentence} {steps} steps (0-{steps - 1})"
        if late and text not in self.warned:
            self.warned.add(text)
            warn_at_call_site(text + "; those calls stay quantized.", PolicyRuleWarning)

    def reset(self) -> None:
        with self.lock:
            self.step = self.last_t = None
            self.runs = self.model_calls = 0
            self.counts.clear()

    def on_model_call(self, timestep: object) -> None:
        t = None
        if isinstance(timestep, torch.Tensor) and timestep.numel():
            t = float(timestep.detach().float().max())
        elif isinstance(timestep, (int, float)):
            t = float(timestep)
        with self.lock:
            self.model_calls += 1
            if self.by_callback:
                if self.step is None:
                    self.step, self.runs = 0, 1
                return
            if self.step is None or (t is not None and self.last_t is not None and t > self.last_t):
                if self.step is not None:  # a run ended after steps 0..self.step
                    self._unreached(self.step + 1, "never matched: the run that ended had")
                self.step = 0
                self.runs += 1
            elif t is None or t != self.last_t:
                self.step += 1
            self.last_t = t

    def on_step_end(self, index: int, total: int | None) -> None:
        with self.lock:
            if total is not None and total > 0:
                self._unreached(total, "can never match: the pipeline runs")
            self.by_callback = True
            if self.step is None:
                self.runs = 1
            if total is not None and index + 1 >= total:
                self.step, self.last_t = 0, None
                self.runs += 1
            else:
                self.step = index + 1


def _ranges(values: Iterable[int]) -> str:
    """{0, 1, 2, 5} -> '0-2, 5'."""
    spans: list[tuple[int, int]] = []
    for v in sorted(values):
        if spans and spans[-1][1] == v - 1:
            spans[-1] = (spans[-1][0], v)
        else:
            spans.append((v, v))
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _iterable(name: str, values: object, what: str) -> Iterable[Any]:
    """`values` if it is a collection (not a str), else TypeError naming the argument."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a {what}, got {values!r} ({type(values).__name__})")
    return values


def _ints(name: str, values: Iterable[int]) -> frozenset[int]:
    out = frozenset(_iterable(name, values, "set of non-negative ints"))
    for v in out:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must hold non-negative ints, got {v!r}")
    return out


@dataclass(frozen=True)
class PrecisionPolicy:
    """Which attention calls run in high precision; every other call runs the quantized method.

    `layers`: global block indices (see the module docstring); `steps`: 0-based denoising steps;
    `kinds`: subset of ("self", "cross"); `modules`: fnmatch patterns on attention module names
    ("blocks.0.attn2", "single_transformer_blocks.*"). A call is kept if any rule matches.
    `high_precision`: "native" runs the kept call through the unpatched
    `torch.nn.functional.scaled_dot_product_attention` (the exact op the unmodified model runs, in its
    own dtype: what the paper's FP16 fallback is, and free); a method name or `AttentionConfig` with no
    quantized operand (e.g. "fp", the fp32 tiled reference) runs it through mxattention instead. Where
    the log-sum-exp is needed (diffusers' ring attention), "native" calls run torch's flash attention
    op that returns it, or "fp" where none serves the call (masks or fp32 on CUDA).

    The policy carries mutable run state (step tracker, counts) outside the compared fields; one policy
    object per concurrently running pipeline. `dataclasses.replace` gives a policy with fresh state.
    Threads: call sites are tracked per thread, counts under a lock, the step count is shared.
    """

    layers: frozenset[int] = frozenset()
    steps: frozenset[int] = frozenset()
    kinds: frozenset[str] = frozenset()
    modules: tuple[str, ...] = ()
    high_precision: str | AttentionConfig = NATIVE
    _state: _PolicyState = field(default_factory=_PolicyState, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", _ints("layers", self.layers))
        object.__setattr__(self, "steps", _ints("steps", self.steps))
        if isinstance(self.kinds, str):
            raise ValueError(f"kinds must be a set drawn from {KINDS}, got {self.kinds!r}")
        kinds = frozenset(_iterable("kinds", self.kinds, f"set drawn from {KINDS}"))
        if not kinds <= set(KINDS):
            raise ValueError(f"kinds must be a set drawn from {KINDS}, got {self.kinds!r}")
        object.__setattr__(self, "kinds", kinds)
        if isinstance(self.modules, str):
            raise TypeError("modules must be a sequence of fnmatch patterns, not one string")
        patterns = _iterable("modules", self.modules, "sequence of fnmatch patterns")
        object.__setattr__(self, "modules", tuple(str(p) for p in patterns))
        self._state.rule_steps = self.steps
        if self.high_precision != NATIVE and get_method(self.high_precision).quantized:
            raise ValueError(
                f"high_precision must be 'native' or a method with no quantized operand (e.g. 'fp'), "
                f"got {get_method(self.high_precision).describe()!r}"
            )

    @classmethod
    def wan22(cls, num_steps: int = 40, *, high_precision: str | AttentionConfig = NATIVE) -> PrecisionPolicy:
        """The paper's Wan2.2 policy: block 0 and the final 2 of `num_steps` steps in high precision."""
        if isinstance(num_steps, bool) or not isinstance(num_steps, int):
            raise TypeError(f"num_steps must be an int >= 2, got {num_steps!r} ({type(num_steps).__name__})")
        if num_steps < 2:
            raise ValueError(f"num_steps must be an int >= 2, got {num_steps}")
        return cls(layers={0}, steps={num_steps - 2, num_steps - 1}, high_precision=high_precision)

    @property
    def high_precision_method(self) -> AttentionConfig:
        """The mxattention method kept calls use when they cannot (or are not to) run natively."""
        return get_method("fp" if self.high_precision == NATIVE else self.high_precision)

    # ---- decisions -------------------------------------------------------------------------------

    @property
    def step(self) -> int | None:
        """The current denoising step (0-based), None before the first tracked model call."""
        return self._state.step

    def keeps(self, site: AttentionSite | None, step: int | None, kind: str) -> bool:
        """Pure rule: does a call at `site`, `step`, of `kind` stay in high precision?"""
        if kind in self.kinds or (step is not None and step in self.steps):
            return True
        if site is None:
            return False
        if site.block is not None and site.block in self.layers:
            return True
        return any(fnmatch.fnmatchcase(site.name, p) for p in self.modules)

    def route_call(self, q_len: int, k_len: int, site: int, step: torch.Tensor | None) -> bool:
        """`route` with an op's arguments: `site` an index (THREAD_SITE: this thread's site), `step`
        the traced step tensor or None (the tracked step)."""
        step_ = _UNSET if step is None else int(step) if int(step) >= 0 else None
        return self.route(q_len, k_len, site=site_of(site), step=step_)

    def traced_where(self) -> tuple[int, torch.Tensor | None]:
        """While Dynamo traces: (the graph's site index, this forward's step tensor) for an op call."""
        return traced_site(), traced_step(self)

    def route(self, q_len: int, k_len: int, *, site: Any = _UNSET, step: Any = _UNSET) -> bool:
        """Decide and count one attention call; True means high precision. `site` and `step` default
        to this thread's current site and the tracked step (compiled calls pass the graph's)."""
        site = current_site() if site is _UNSET else site
        cross = site.cross if site is not None and site.cross is not None else q_len != k_len
        kind = "cross" if cross else "self"
        st = self._state
        step = st.step if step is _UNSET else step
        keep = self.keeps(site, step, kind)
        with st.lock:
            st.counts[
                (step, None if site is None else site.block, "" if site is None else site.name, kind, keep)
            ] += 1
        return keep

    # ---- step tracking and hooks -----------------------------------------------------------------

    def step_callback(self, pipe: Any, step_index: int, timestep: Any, callback_kwargs: dict) -> dict:
        """Use as a diffusers pipeline's `callback_on_step_end`: the pipeline's own step index."""
        self._state.on_step_end(int(step_index), getattr(pipe, "num_timesteps", None))
        return callback_kwargs

    def attach(self, model: nn.Module | Any, *, steps: str = "timestep") -> PolicyHandle:
        """Install the step / layer hooks on a transformer, or on a pipeline's `transformer`,
        `transformer_2` (Wan2.2 A14B's two experts share one step count) and `unet`. Returns a
        removable handle.

        `steps="timestep"` counts steps from the transformer's timestep input; `steps="callback"`
        leaves the count to `step_callback` (pass it as the pipeline's `callback_on_step_end`).
        """
        if steps not in ("timestep", "callback"):
            raise ValueError(f"steps must be 'timestep' or 'callback', got {steps!r}")
        models = [model] if isinstance(model, nn.Module) else []
        if not models:
            models = [
                m
                for a in ("transformer", "transformer_2", "unet")
                if isinstance(m := getattr(model, a, None), nn.Module)
            ]
        if not models:
            raise TypeError(
                f"attach needs an nn.Module or a pipeline with a transformer or unet, got {type(model).__name__}"
            )
        if steps == "callback":
            with self._state.lock:
                self._state.by_callback = True
        handles: list[Any] = []
        for m in models:
            handles += _install_hooks(m, self._state)
        self._warn_unmatched(models)
        return PolicyHandle(handles)

    def _warn_unmatched(self, models: list[nn.Module]) -> None:
        """`PolicyRuleWarning` for the block and module rules no site of `models` can match."""
        blocks = max((sum(1 for _ in _block_modules(m)) for m in models), default=0)
        where = f"the attached model has {blocks} blocks" + (f" (0-{blocks - 1})" if blocks else "")
        late = sorted(b for b in self.layers if b >= blocks)
        if late:
            warn_at_call_site(
                f"PrecisionPolicy layers {_ranges(late)} can never match: {where}, numbered across its "
                "top-level block lists; those calls stay quantized.",
                PolicyRuleWarning,
            )
        names = [site.name for m in models for site, _ in _sites_of(m)]
        for p in self.modules:
            if not any(fnmatch.fnmatchcase(n, p) for n in names):
                example = f" (its sites are named like {names[-1]!r})" if names else ""
                warn_at_call_site(
                    f"PrecisionPolicy modules pattern {p!r} matches no attention module or block of the "
                    f"attached model{example}; those calls stay quantized.",
                    PolicyRuleWarning,
                )

    def reset(self) -> None:
        """Forget the step count and the call counts."""
        self._state.reset()

    # ---- reporting -------------------------------------------------------------------------------

    def describe(self) -> str:
        """One line: what stays in high precision, and how."""
        parts = []
        if self.layers:
            parts.append(f"blocks {_ranges(self.layers)}")
        if self.steps:
            parts.append(f"steps {_ranges(self.steps)}")
        if self.kinds:
            parts.append(f"{' and '.join(sorted(self.kinds))}-attention")
        if self.modules:
            parts.append(f"modules {', '.join(self.modules)}")
        how = (
            "unpatched torch SDPA" if self.high_precision == NATIVE else self.high_precision_method.describe()
        )
        kept = "; ".join(parts) if parts else "nothing"
        return f"high precision ({how}) for: {kept}; every other attention call quantized"

    def counts(self) -> dict[str, Any]:
        """Counts of quantized / high-precision calls, in total and per step, block and kind."""
        st = self._state
        with st.lock:
            items = list(st.counts.items())
            runs, calls, step = st.runs, st.model_calls, st.step

        def tally(key_of) -> dict:
            out: dict = {}
            for key, n in items:
                row = out.setdefault(key_of(key), {"quantized": 0, "high_precision": 0})
                row["high_precision" if key[4] else "quantized"] += n
            return dict(
                sorted(out.items(), key=lambda kv: (kv[0] is None, kv[0] if kv[0] is not None else 0))
            )

        total = {"quantized": 0, "high_precision": 0}
        for key, n in items:
            total["high_precision" if key[4] else "quantized"] += n
        return {
            **total,
            "runs": runs,
            "model_calls": calls,
            "step": step,
            "by_step": tally(lambda k: k[0]),
            "by_layer": tally(lambda k: k[1]),
            "by_kind": tally(lambda k: k[3]),
        }

    def report(self) -> str:
        """A readable table of `counts()` (print it)."""
        c = self.counts()
        lines = [
            self.describe(),
            f"attention calls: {c['quantized']} quantized, {c['high_precision']} high precision "
            f"(generations {c['runs']}, model calls {c['model_calls']})",
        ]
        for title, rows in (("step", c["by_step"]), ("block", c["by_layer"]), ("kind", c["by_kind"])):
            if rows:
                lines.append(f"{title:>8} {'quantized':>10} {'high':>6}")
                for key, row in rows.items():
                    label = "-" if key is None else str(key)
                    lines.append(f"{label:>8} {row['quantized']:>10} {row['high_precision']:>6}")
        return "\n".join(lines)


class PolicyHandle:
    """The hooks of one `attach`; `remove()` (or leaving the `with` block) takes them off."""

    def __init__(self, handles: list[Any]) -> None:
        self._handles = handles

    def remove(self) -> None:
        while self._handles:
            self._handles.pop().remove()

    def __enter__(self) -> PolicyHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _block_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    lists = [(n, c) for n, c in model.named_children() if isinstance(c, nn.ModuleList)]
    named = [(n, c) for n, c in lists if "block" in n.lower()]
    for name, blocks in named or lists:
        for i, block in enumerate(blocks):
            yield f"{name}.{i}", block


def _is_attention(module: nn.Module) -> bool:
    # diffusers' attention modules all carry a `processor`; others go by their class name.
    return hasattr(module, "processor") or type(module).__name__.endswith("Attention")


_TAGS = (torch.Tag.cudagraph_unsafe,)


@torch.library.custom_op("mxattention::policy_model_call", mutates_args=(), tags=_TAGS)
def _model_call_op(state: str, timestep: torch.Tensor | None, t: float | None) -> torch.Tensor:
    """The step tracker of the policy state `state` sees one model call, at run time; returns the
    step (-1 for none yet) as a 0-d int64 CPU tensor, an input of the attention ops that follow."""
    st = _states.get(state)
    if st is not None:
        st.on_model_call(timestep if timestep is not None else t)
    step = None if st is None else st.step
    return torch.tensor(-1 if step is None else step, dtype=torch.int64)


@_model_call_op.register_fake
def _model_call_op_fake(state, timestep, t):
    return torch.empty((), dtype=torch.int64)


# Ordered effectful: never dropped, even in a graph whose attention calls all fall back.
_model_call_op.register_effect(EffectType.ORDERED)


def _push(site: AttentionSite):
    index = _site_index(site)

    def pre_hook(module: nn.Module, args: tuple) -> None:
        if torch.compiler.is_compiling():
            _trace_sites.append(index)
        else:
            _enter(index)

    def post_hook(module: nn.Module, args: tuple, output: object) -> None:
        if not torch.compiler.is_compiling():
            _leave(index)
        elif _trace_sites and _trace_sites[-1] == index:
            _trace_sites.pop()

    return pre_hook, post_hook


def _install_hooks(model: nn.Module, state: _PolicyState) -> list[Any]:
    handles = []
    params = list(inspect.signature(model.forward).parameters)
    t_index = params.index("timestep") if "timestep" in params else None

    def on_call(module: nn.Module, args: tuple, kwargs: dict) -> None:
        if "timestep" in kwargs:
            t = kwargs["timestep"]
        else:
            t = args[t_index] if t_index is not None and t_index < len(args) else None
        if not torch.compiler.is_compiling():
            state.trace_step = None  # eager hooks: the attention ops read the tracked step
            state.on_model_call(t)
        elif isinstance(t, torch.Tensor):
            state.trace_step = _model_call_op(state.token, t, None)
        else:
            state.trace_step = _model_call_op(
                state.token, None, float(t) if isinstance(t, (int, float)) else None
            )

    handles.append(model.register_forward_pre_hook(on_call, with_kwargs=True))
    for site, module in _sites_of(model):
        pre, post = _push(site)
        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post, always_call=True))
    return handles


def _sites_of(model: nn.Module) -> list[tuple[AttentionSite, nn.Module]]:
    """The (site, module) pairs the hooks go on: the blocks, and the attention modules (each with
    its block's index, None outside every block)."""
    blocks = {name: i for i, (name, _) in enumerate(_block_modules(model))}
    out = []
    for name, module in model.named_modules():
        in_block = next((b for b in blocks if name == b or name.startswith(b + ".")), None)
        if name in blocks:
            out.append((AttentionSite(name, blocks[name]), module))
        elif _is_attention(module):
            cross = getattr(module, "is_cross_attention", None)
            site = AttentionSite(
                name,
                None if in_block is None else blocks[in_block],
                cross if isinstance(cross, bool) else None,
            )
            out.append((site, module))
    return out
