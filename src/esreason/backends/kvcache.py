"""A KV cache that allocates its buffers once per decode instead of growing by ``torch.cat``.

transformers' ``DynamicLayer.update`` concatenates the new key/value states onto the cache
at every step, copying the whole cache each time: at batch 256 on the embedded default
that copy took as long as all the matrix multiplies together (benchmarks/sampler.py).
:class:`PreallocatedLayer` is a ``DynamicLayer`` whose keys/values are views of buffers
sized for prompt + response, written in place; attention still sees exactly the tokens
seen so far (unlike ``StaticCache``, which attends over its full length every step).

Only plain full-attention caches are replaced (models whose default ``DynamicCache``
holds nothing but ``DynamicLayer``s: Llama, Qwen2, Mistral without sliding window, ...).
Sliding-window, linear-attention or KV-sharing models keep transformers' own cache. Relies
on the ``DynamicLayer`` attributes of transformers 5.23 (``keys``, ``values``,
``is_initialized``); tests/test_sampling.py compares against ``generate`` to catch drift.

The keyword a forward takes the cache under changed: ``past_key_values`` up to transformers
5.23, ``cache`` from 5.24 (where ``past_key_values`` still works until 5.40.0 but warns, and
the output's ``past_key_values`` attribute logs "``past_key_values``/``cache_params`` are
deprecated"). :func:`cache_keyword` picks the name once per model, so the decode loop passes
and reads only the name the installed transformers expects.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


# The first transformers release whose forwards take the cache as ``cache`` (5.24.0 renamed
# ``past_key_values``/``cache_params``; the old names are removed in 5.40.0).
CACHE_RENAMED_IN = (5, 24)


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string like '5.24.0' or '5.25.0.dev0'."""
    parts = version.split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def cache_keyword(model: Any) -> str:
    """The keyword ``model``'s forward takes its KV cache under: ``"cache"`` or ``"past_key_values"``.

    Read from the forward's signature (``inspect.signature`` follows the ``functools.wraps``
    of transformers' deprecation decorators to the real parameters); a forward that names
    neither (``**kwargs`` only, e.g. remote code) gets the installed transformers' name.
    The output carries the updated cache under the same name.
    """
    params = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return "cache" if _release(transformers_version()) >= CACHE_RENAMED_IN else "past_key_values"


def transformers_version() -> str:
    """The installed transformers release, e.g. '5.23.0'."""
    import transformers

    return str(transformers.__version__)


class PreallocatedLayer(DynamicLayer):
    """One layer's cache: buffers [B, heads, capacity, head_dim]; keys/values are [:, :, :length] views."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, _, dk = key_states.shape
        self._k = key_states.new_zeros((b, h, self.capacity, dk))  # [B, H, cap, dk]
        self._v = value_states.new_zeros((b, value_states.shape[1], self.capacity, value_states.shape[-1]))
        self.length = 0
        self._reslice()
        self.is_initialized = True

    def _reslice(self) -> None:
        assert self._k is not None and self._v is not None
        self.keys = self._k[:, :, :self.length]
        self.values = self._v[:, :, :self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write [B, H, q, d] new states after the cached ones; return the [B, H, length, d] views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self._k is not None and self._v is not None
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"KV cache capacity {self.capacity} exceeded ({end} positions)")
        self._k[:, :, self.length:end] = key_states
        self._v[:, :, self.length:end] = value_states
        self.length = end
        self._reslice()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep/reorder batch rows: buffers become [len(beam_idx), H, cap, d].

        Only the ``length`` positions written so far are copied (the rest is never read: keys and
        values are the ``[:length]`` views); compaction mid-decode copies about half the buffer.
        """
        if self.is_initialized and self._k is not None and self._v is not None:
            idx = beam_idx.to(self._k.device)
            self._k = self._select_rows(self._k, idx)
            self._v = self._select_rows(self._v, idx)
            self._reslice()

    def _select_rows(self, buf: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """[B, H, cap, d] -> [len(idx), H, cap, d] with rows ``idx`` in positions [0, length)."""
        out = buf.new_empty((idx.numel(), *buf.shape[1:]))
        torch.index_select(buf[:, :, :self.length], 0, idx, out=out[:, :, :self.length])
        return out

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("PreallocatedLayer does not support crop")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("PreallocatedLayer does not support batch_repeat_interleave")

    def reset(self) -> None:
        self._k = self._v = None
        self.keys = self.values = None
        self.length = 0
        self.is_initialized = False


def preallocated_cache(config: Any, capacity: int) -> DynamicCache | None:
    """A ``DynamicCache`` for ``config`` whose layers preallocate ``capacity`` positions.

    Returns None (use the model's default cache) unless every layer of the default cache
    is a plain full-attention ``DynamicLayer``.
    """
    cache = DynamicCache(config=config)
    if not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    cache.layers = [PreallocatedLayer(capacity) for _ in cache.layers]
    return cache
