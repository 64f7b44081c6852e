"""Interned method keys: how a method crosses a custom op's boundary (ops take strings, not configs).

Exposes `method_key(cfg) -> str` (a short token, the same object for equal configs: a preset's
name, else "<name>#<n>") and `config_from_key(key) -> AttentionConfig` (a dict look-up; a preset's
name also works before it was interned). A key is valid in the process that made it.
"""

from __future__ import annotations

import threading

import torch

from mxattention.attention.config import PRESETS, AttentionConfig, get_method

_KEYS: dict[AttentionConfig, str] = {}
_CONFIGS: dict[str, AttentionConfig] = {}
_lock = threading.Lock()


@torch.compiler.assume_constant_result
def method_key(cfg: AttentionConfig) -> str:
    """The interned key of `cfg`: equal configs share one key (a preset keeps its name)."""
    key = _KEYS.get(cfg)
    if key is None:
        with _lock:
            key = _KEYS.get(cfg)
            if key is None:
                key = cfg.name if PRESETS.get(cfg.name) == cfg else f"{cfg.name}#{len(_KEYS)}"
                _KEYS[cfg] = key
                _CONFIGS[key] = cfg
    return key


def config_from_key(key: str) -> AttentionConfig:
    """The config `method_key` gave `key`, or the preset named `key` (ValueError if neither)."""
    cfg = _CONFIGS.get(key)
    if cfg is None:
        cfg = get_method(key)  # a preset's name, passed as is by the public entry
        with _lock:
            _CONFIGS.setdefault(key, cfg)
    return cfg
