"""A KV cache whose buffers stay contiguous and grow in blocks, instead of growing by ``torch.cat``.

transformers' ``DynamicLayer.update`` concatenates the new key/value states onto the cache
at every step, copying the whole cache each time: at batch 256 on the embedded default
that copy took as long as all the matrix multiplies together (benchmarks/sampler.py).
:class:`PreallocatedLayer` is a ``DynamicLayer`` whose buffers [B, heads, width, head_dim] are
written in place and widened only every :data:`WINDOW_BLOCK` positions (:func:`window`).

Attention reads the *whole* buffer, ``width`` >= the positions written, and the mask hides the
zero positions past them (the layer reports ``width`` as the mask's kv length; transformers pads
the 2-D padding mask with False up to it, and causality hides them as well). Why not views of one
buffer sized for prompt + response, ``[:, :, :length]``, as before: such a view is not contiguous
over the batch, and PyTorch's CPU ``bmm`` then takes a per-matrix path that was 3-4x slower than on
contiguous keys at the demo's decode shapes (2,048 rows x 4 heads, 16-64 positions: 3.9 vs 1.0 ms
per QK^T), more than the up to 15 extra masked positions cost. A masked position contributes an
exact 0 to the softmax and the weighted sum, so the result is the attention over the written
positions up to float rounding; every cache that follows :func:`window` (the population forward's
:class:`esreason.backends.popmodel.PopulationKV` too) attends over the same width at every step,
so the sequential and population paths keep computing the same bits.

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


WINDOW_BLOCK = 16
"""Positions a cache buffer grows by (see :func:`window`)."""


def window(end: int, capacity: int, block: int = WINDOW_BLOCK) -> int:
    """The width of a cache buffer holding ``end`` positions: ``end`` rounded up to ``block``, at most
    ``capacity`` (RuntimeError beyond it).

    Attention reads the whole width; the positions past ``end`` are zeros the mask hides. A function of
    ``end`` alone, so every cache that follows it (:class:`PreallocatedLayer`, the population forward's
    :class:`esreason.backends.popmodel.PopulationKV`) attends over the same width at every step.
    """
    if end > capacity:
        raise RuntimeError(f"KV cache capacity {capacity} exceeded ({end} positions)")
    return min(capacity, -(-end // block) * block)


def grown(buf: torch.Tensor, length: int, width: int) -> torch.Tensor:
    """``buf`` [B, H, w, d] widened to [B, H, width, d]: positions < min(``length``, w) copied, the rest
    zeros (masked, but read by attention, so finite: 0 x NaN would be NaN)."""
    new = buf.new_zeros((*buf.shape[:2], width, buf.shape[-1]))
    keep = min(length, buf.shape[-2])
    new[:, :, :keep] = buf[:, :, :keep]
    return new


class PreallocatedLayer(DynamicLayer):
    """One layer's cache: contiguous buffers [B, heads, width, head_dim] grown in blocks of ``block``.

    ``keys``/``values`` are the *whole* buffers (``width`` >= ``length`` positions); positions
    ``length..width-1`` are zeros that the mask hides (:meth:`get_mask_sizes` reports ``width``, and
    transformers pads the 2-D padding mask with False up to it; causality hides them too).
    """

    def __init__(self, capacity: int, block: int = WINDOW_BLOCK) -> None:
        super().__init__()
        self.capacity = capacity
        self.block = block
        self.length = 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def width_for(self, end: int) -> int:
        """The buffer width after ``end`` positions are written (:func:`window`)."""
        return window(end, self.capacity, self.block)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.length = 0
        self._k = key_states.new_zeros((*key_states.shape[:2], 0, key_states.shape[-1]))  # [B, H, 0, d]
        self._v = value_states.new_zeros((*value_states.shape[:2], 0, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write [B, H, q, d] new states after the cached ones; return the [B, H, width, d] buffers."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self._k is not None and self._v is not None
        end = self.length + key_states.shape[-2]
        width = self.width_for(end)
        if width != self._k.shape[-2]:
            self._k, self._v = grown(self._k, self.length, width), grown(self._v, self.length, width)
        self._k[:, :, self.length:end] = key_states
        self._v[:, :, self.length:end] = value_states
        self.length = end
        self.keys, self.values = self._k, self._v
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv length, offset) of the mask: the width the buffers will have after this forward's update."""
        return self.width_for(self.get_seq_length() + query_length), 0

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep/reorder batch rows: buffers become [len(beam_idx), H, width, d] (one contiguous gather)."""
        if self.is_initialized and self._k is not None and self._v is not None:
            idx = beam_idx.to(self._k.device)
            self._k = self._k.index_select(0, idx)
            self._v = self._v.index_select(0, idx)
            self.keys, self.values = self._k, self._v

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


def plain_full_attention(config: Any) -> bool:
    """Whether ``config``'s default ``DynamicCache`` holds only plain full-attention ``DynamicLayer``s
    (Llama, Qwen2, Mistral without sliding window, ...): every layer attends to every cached position,
    so one padding mask serves all layers."""
    layers = DynamicCache(config=config).layers
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def preallocated_cache(config: Any, capacity: int) -> DynamicCache | None:
    """A ``DynamicCache`` for ``config`` whose layers preallocate ``capacity`` positions.

    Returns None (use the model's default cache) unless every layer of the default cache
    is a plain full-attention ``DynamicLayer`` (:func:`plain_full_attention`).
    """
    if not plain_full_attention(config):
        return None
    cache = DynamicCache(config=config)
    cache.layers = [PreallocatedLayer(capacity) for _ in cache.layers]
    return cache
