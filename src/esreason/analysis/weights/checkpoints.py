"""Streaming, paired access to two Hugging Face checkpoints stored as safetensors.

Every weight analysis (paper §RQ2: drift, update sparsity, thresholding,
localisation) compares a tuned checkpoint theta with its base theta_0 coordinate by
coordinate. Models do not fit in memory twice in float64, so this module reads them
tensor by tensor -- and large tensors in row chunks -- with ``safetensors.safe_open``:
peak memory stays near one chunk (``chunk_elems`` elements) of each checkpoint plus
the float64 temporaries of the analysis.

A checkpoint is an HF directory: ``config.json`` plus ``model.safetensors`` or a
sharded ``model.safetensors.index.json``. Both checkpoints must hold the same tensor
names with the same shapes; a mismatch raises :class:`UserError` naming the tensor.

**Tied weights.** When ``config.json`` says ``tie_word_embeddings: true`` the LM head
*is* the input embedding. ``save_pretrained`` stores that shared tensor once (under
the embedding's name), but other writers store both names with identical data. Rule:
with tied embeddings in the config, ``lm_head.weight`` is dropped from the analysis
when the embedding is also stored -- after checking that the two tensors are
bit-identical in that checkpoint (otherwise loading would be ambiguous and we raise).
Without the config flag nothing is deduplicated: two parameters that merely hold equal
values are still two parameters. Writers (:mod:`esreason.analysis.weights.threshold`) keep
every stored name, so a written checkpoint has the layout of the one it came from.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from esreason.errors import UserError
from esreason.io.safetensors_stream import FLOAT_ST, ST_DTYPES, TORCH_TO_ST, SafetensorsStreamWriter  # noqa: F401

#: Default chunk size in elements (float64: 32 MiB per temporary).
DEFAULT_CHUNK_ELEMS = 1 << 22

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

#: Input-embedding names by architecture, tried in order when resolving the tie.
EMBEDDING_NAMES = ("model.embed_tokens.weight", "transformer.wte.weight", "gpt_neox.embed_in.weight",
                   "model.decoder.embed_tokens.weight", "embed_tokens.weight")
LM_HEAD_NAMES = ("lm_head.weight", "embed_out.weight")



@dataclass(frozen=True)
class TensorInfo:
    """One stored tensor: name, shape, safetensors dtype string ('BF16', ...), shard file."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    file: Path

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_ST


class Checkpoint:
    """The tensors of an HF checkpoint directory, read lazily.

    ``names`` lists the tensors an analysis visits (sorted by name; the tied LM head
    removed per the module rule); ``stored_names`` lists everything on disk.
    """

    def __init__(self, path: str | Path, label: str = "checkpoint") -> None:
        from safetensors import SafetensorError, safe_open

        if str(path) == "demo":  # the embedded default, as everywhere else in the CLI
            from esreason.embedded import demo_model_dir

            path = demo_model_dir()
        self.path = Path(path).expanduser()
        self.label = label
        if not self.path.is_dir():
            raise UserError(f"{label} checkpoint not found: {self.path} (expected a Hugging Face model directory)")
        cfg_path = self.path / "config.json"
        if not cfg_path.is_file():
            raise UserError(f"{label} checkpoint {self.path} has no config.json")
        try:
            self.config: dict[str, Any] = json.loads(cfg_path.read_text())
        except json.JSONDecodeError as exc:
            raise UserError(f"{cfg_path}: invalid JSON ({exc.msg})") from None
        files = self._shard_files()
        self.infos: dict[str, TensorInfo] = {}
        for file in files:
            try:
                with safe_open(str(file), framework="pt") as fh:
                    for name in fh.keys():
                        sl = fh.get_slice(name)
                        info = TensorInfo(name, tuple(int(s) for s in sl.get_shape()), sl.get_dtype(), file)
                        if name in self.infos:
                            raise UserError(f"{label} checkpoint {self.path}: tensor {name!r} stored twice "
                                            f"({self.infos[name].file.name}, {file.name})")
                        self.infos[name] = info
            except (OSError, ValueError, SafetensorError) as exc:
                raise UserError(f"{label} checkpoint: cannot read {file}: {exc}") from None
        if not self.infos:
            raise UserError(f"{label} checkpoint {self.path} holds no tensors")
        self.tied_alias: dict[str, str] = self._tied_aliases()

    # ------------------------------------------------------------------ layout

    def _shard_files(self) -> list[Path]:
        index = self.path / INDEX_FILE
        single = self.path / SINGLE_FILE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise UserError(f"{index}: not a safetensors index (needs a 'weight_map' object)") from None
            files = sorted({self.path / f for f in weight_map.values()})
            for f in files:
                if not f.is_file():
                    raise UserError(f"{index}: shard {f.name} is missing")
            return files
        if single.is_file():
            return [single]
        raise UserError(f"{self.label} checkpoint {self.path} has neither {SINGLE_FILE} nor {INDEX_FILE}")

    @property
    def tie_word_embeddings(self) -> bool:
        """The config's tie flag (top level, or the text sub-config of multimodal models)."""
        if "tie_word_embeddings" in self.config:
            return bool(self.config["tie_word_embeddings"])
        text = self.config.get("text_config")
        return bool(isinstance(text, dict) and text.get("tie_word_embeddings", False))

    def _tied_aliases(self) -> dict[str, str]:
        """{lm_head name: embedding name} for stored duplicates of a tied embedding."""
        if not self.tie_word_embeddings:
            return {}
        emb = next((n for n in EMBEDDING_NAMES if n in self.infos), None)
        head = next((n for n in LM_HEAD_NAMES if n in self.infos), None)
        if emb is None or head is None:
            return {}
        a, b = self.infos[emb], self.infos[head]
        if a.shape != b.shape or a.dtype != b.dtype or not self._equal(emb, head):
            raise UserError(f"{self.label} checkpoint {self.path}: config says tie_word_embeddings but "
                            f"{head!r} differs from {emb!r}; the checkpoint is ambiguous")
        return {head: emb}

    def _equal(self, a: str, b: str) -> bool:
        with self.reader() as r:
            for (_, x), (_, y) in zip(r.chunks(self.infos[a]), r.chunks(self.infos[b])):
                if not torch.equal(x, y):
                    return False
        return True

    @property
    def stored_names(self) -> list[str]:
        return sorted(self.infos)

    @property
    def names(self) -> list[str]:
        return sorted(n for n in self.infos if n not in self.tied_alias)

    def extra_files(self) -> list[Path]:
        """Non-weight files to copy into a derived checkpoint (config, tokenizer, generation)."""
        skip_suffixes = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".h5")
        out = []
        for f in sorted(self.path.iterdir()):
            if not f.is_file() or f.name.startswith(".") or f.name.endswith(skip_suffixes):
                continue
            if f.name in (INDEX_FILE, "es_state.json", "COMPLETE") or f.name.endswith(".index.json"):
                continue
            out.append(f)
        return out

    @contextlib.contextmanager
    def reader(self, chunk_elems: int = DEFAULT_CHUNK_ELEMS) -> Iterator["Reader"]:
        r = Reader(self, chunk_elems)
        try:
            yield r
        finally:
            r.close()


class Reader:
    """Open shard handles of one checkpoint; yields tensors in row chunks."""

    def __init__(self, ckpt: Checkpoint, chunk_elems: int) -> None:
        if chunk_elems < 1:
            raise ValueError("chunk_elems must be >= 1")
        self.ckpt = ckpt
        self.chunk_elems = chunk_elems
        self._handles: dict[Path, Any] = {}
        self._stack = contextlib.ExitStack()

    def _handle(self, file: Path) -> Any:
        from safetensors import safe_open

        if file not in self._handles:
            self._handles[file] = self._stack.enter_context(safe_open(str(file), framework="pt"))
        return self._handles[file]

    def close(self) -> None:
        self._stack.close()
        self._handles.clear()

    def chunks(self, info: TensorInfo) -> Iterator[tuple[int, torch.Tensor]]:
        """(flat offset, 1-D tensor in the stored dtype) over ``info`` in row-major order.

        Tensors above ``chunk_elems`` elements are read a block of leading-dimension rows
        at a time through ``get_slice``, so the full tensor is never materialised.
        """
        fh = self._handle(info.file)
        if len(info.shape) == 0 or info.numel <= self.chunk_elems:
            yield 0, fh.get_tensor(info.name).reshape(-1)
            return
        row = info.numel // info.shape[0]
        rows = max(1, self.chunk_elems // max(row, 1))
        sl = fh.get_slice(info.name)
        for start in range(0, info.shape[0], rows):
            stop = min(start + rows, info.shape[0])
            yield start * row, sl[start:stop].reshape(-1)


@dataclass
class PairedChunk:
    """Aligned chunks of one tensor in both checkpoints (1-D, stored dtypes)."""

    name: str
    shape: tuple[int, ...]
    offset: int
    base: torch.Tensor
    tuned: torch.Tensor
    base_dtype: str
    tuned_dtype: str

    @property
    def numel(self) -> int:
        return int(self.base.numel())


def check_compatible(base: Checkpoint, tuned: Checkpoint) -> list[str]:
    """Same analysed names and shapes in both, or :class:`UserError` naming the tensor. Returns the names."""
    a, b = set(base.names), set(tuned.names)
    only_a, only_b = sorted(a - b), sorted(b - a)
    if only_a:
        raise UserError(f"tensor {only_a[0]!r} is in {base.label} ({base.path}) but not in {tuned.label} "
                        f"({tuned.path})" + (f"; {len(only_a) - 1} more" if len(only_a) > 1 else ""))
    if only_b:
        raise UserError(f"tensor {only_b[0]!r} is in {tuned.label} ({tuned.path}) but not in {base.label} "
                        f"({base.path})" + (f"; {len(only_b) - 1} more" if len(only_b) > 1 else ""))
    for name in base.names:
        sa, sb = base.infos[name].shape, tuned.infos[name].shape
        if sa != sb:
            raise UserError(f"tensor {name!r} has shape {list(sa)} in {base.label} but {list(sb)} in {tuned.label}")
        if base.infos[name].is_float != tuned.infos[name].is_float:
            raise UserError(f"tensor {name!r} is {base.infos[name].dtype} in {base.label} but "
                            f"{tuned.infos[name].dtype} in {tuned.label}")
    return base.names


def paired_chunks(base: Checkpoint, tuned: Checkpoint, *, chunk_elems: int = DEFAULT_CHUNK_ELEMS,
                  names: Sequence[str] | None = None) -> Iterator[PairedChunk]:
    """Aligned chunks of every analysed tensor (sorted by name), both checkpoints streamed."""
    names = check_compatible(base, tuned) if names is None else list(names)
    with base.reader(chunk_elems) as rb, tuned.reader(chunk_elems) as rt:
        for name in names:
            ib, it = base.infos[name], tuned.infos[name]
            for (off, xb), (_, xt) in zip(rb.chunks(ib), rt.chunks(it)):
                yield PairedChunk(name, ib.shape, off, xb, xt, ib.dtype, it.dtype)
