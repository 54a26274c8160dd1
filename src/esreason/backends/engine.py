"""Engines: self-contained holders of an ES centre that evaluate members and apply updates.

An engine is what one worker of the Ray pool (:mod:`esreason.backends.ray_pool`) runs:
it owns a copy of the centre, evaluates members from their seeds (perturb, generate,
restore bit-exactly), applies the same update as every other engine from
``(seeds, weights, alpha)`` and reports a checksum of its centre so the pool can detect
engines that drifted apart. Nothing but seeds, scalars, prompts and response texts
crosses the process boundary, except the full state on start-up and on re-broadcast.

:class:`HFEngine` is the transformers engine (CPU, or one GPU); the vLLM engine lives in
:mod:`esreason.backends.vllm`. This module imports neither Ray nor vLLM.

State snapshots (``export_state`` / ``load_state``) are the files of an ordinary
checkpoint (:meth:`HFPolicy.save`: ``model.safetensors``, tokenizer files and, with
master weights, ``es_master/master.safetensors``) as ``{relative path: bytes}``; safetensors
round-trips every bit, so a re-broadcast engine is bit-identical to its source. Engines start from
either those bytes or a :class:`StateDir`: the same files already written once on the node
(:func:`shared_state_dir`), passed by path. The Ray pool passes a :class:`StateDir`: bytes sent as an actor argument are deserialised into every engine's heap (45.7 GB per
engine at 7B with fp32 masters).
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

import torch

import numpy as np

from esreason.backends.base import Generation, PopulationResult, SamplingParams
from esreason.errors import UserError
from esreason.verifiers.batch import score_texts

#: A checkpoint as ``{relative file name: file bytes}``.
StateFiles = dict[str, bytes]


@dataclass(frozen=True)
class StateDir:
    """A start state by path: the directory :func:`shared_state_dir` wrote (``.complete`` in it)."""

    path: str
    """The directory on the node that wrote it (the pool's driver)."""
    key: str
    """Its :func:`state_key`: the directory's name under :func:`shared_state_root` on every node."""
    files: Any = None
    """Where an engine on another node gets the bytes to write its node's copy (a Ray object
    reference of the :data:`StateFiles`, fetched once per node); None on a one-node cluster."""
    node: str | None = None
    """The Ray node id of the node that wrote ``path`` (set with ``files``): an engine on another
    node reads ``path`` in place only where it lies under its own :func:`shared_state_root` (a
    filesystem the nodes share, ``ESREASON_ENGINE_DIR``); otherwise it writes its node's copy."""


#: What an engine starts from: the files' bytes, or where they already are on the node.
StartState = StateFiles | StateDir


@dataclass(frozen=True)
class MemberOutput:
    """One evaluated member: its responses (in prompt order) and the engine's generate time."""

    index: int
    texts: list[str]
    num_tokens: int
    seconds: float
    lengths: tuple[int, ...] = ()
    """Generated tokens of each response, in prompt order (empty from an engine that does not report them)."""

    @classmethod
    def of(cls, index: int, gen: Generation, seconds: float) -> "MemberOutput":
        """The output of one member's generate call."""
        return cls(index, list(gen.texts), gen.num_tokens, seconds, tuple(len(ids) for ids in gen.token_ids))


@runtime_checkable
class Engine(Protocol):
    """What a pool worker needs from an engine (HF or vLLM)."""

    def run_member(self, index: int, seed: int, sigma: float, prompts: Sequence[str],
                   params: SamplingParams) -> MemberOutput:
        """Generate at centre + sigma * eps(seed) and restore the centre bit-exactly."""

    def apply_update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float) -> float:
        """centre += alpha/N sum_i w_i eps(seeds_i); returns ||delta||_2."""

    def join_group(self, spec: Any) -> None:
        """Join the pool's process group (:class:`esreason.backends.collective.GroupSpec`); all engines at once."""

    def apply_update_sharded(self, seeds: Sequence[int], weights: Sequence[float], alpha: float,
                             num_shards: int, shards: Sequence[int]) -> float:
        """The same update, this engine summing only ``shards`` and all-reducing with the group
        (:mod:`esreason.es.sharded`); returns ||delta||_2."""

    def checksum(self) -> str:
        """Hex digest of the centre's bits (equal digests <=> identical centres)."""

    def noise_domain(self) -> str:
        """:func:`esreason.es.noise.generator_domain` of the device holding the weights."""

    def export_state(self) -> StateFiles:
        """The centre as checkpoint files."""

    def load_state(self, state: StartState) -> None:
        """Replace the centre by ``state`` (from :meth:`export_state` of a same-kind engine, or its directory)."""


#: Threads that hash a checksum's tensors at once (hashlib releases the GIL on large buffers).
CHECKSUM_THREADS = 8


def _tensor_digest(name: str, t: torch.Tensor) -> bytes:
    data = t.detach().to("cpu").contiguous()  # [numel] bytes once on the host (a view when already there)
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{name}|{data.dtype}|{tuple(data.shape)}".encode())
    h.update(memoryview(data.reshape(-1).view(torch.uint8).numpy()))  # no second copy of the bytes
    return h.digest()


def tensors_checksum(named: Iterable[tuple[str, torch.Tensor]], threads: int = CHECKSUM_THREADS) -> str:
    """blake2b over the per-tensor blake2b digests of (name, dtype, shape, raw bytes), in name order.

    Engines of different kinds (HF, vLLM) report the same digest for the same centre as
    long as they hash the tensors under their Hugging Face names and dtypes. Tensors are hashed
    in ``threads`` threads at once (one thread takes about 15 s for the 9 GB of a 1.5B model's
    weights and masters); at most ``threads`` host copies of device tensors are alive at a time.
    The digest does not depend on ``threads``.
    """
    from concurrent.futures import ThreadPoolExecutor

    items = sorted(named, key=lambda item: item[0])
    if threads <= 1 or len(items) <= 1:
        digests = [_tensor_digest(n, t) for n, t in items]
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            digests = list(pool.map(lambda item: _tensor_digest(*item), items))
    h = hashlib.blake2b(digest_size=16)
    for d in digests:
        h.update(d)
    return h.hexdigest()


def policy_checksum(policy: Any) -> str:
    """Checksum of an :class:`~esreason.backends.hf.HFPolicy` centre (weights, plus fp32 masters if kept)."""
    named: list[tuple[str, torch.Tensor]] = [(n, p) for n, p in policy.params.params]
    masters = policy.params.master_state()
    if masters is not None:
        named += [(f"master:{n}", t) for n, t in masters.items()]
    return tensors_checksum(named)


def policy_noise_domain(policy: Any) -> str:
    """Generator domain of an HFPolicy's weights (where its seeds mean the same directions)."""
    from esreason.es.noise import generator_domain

    noise = getattr(policy.params, "noise_device", None)  # a host-resident reference draws on the GPU
    return generator_domain(noise if noise is not None else next(policy.model.parameters()).device)


def check_noise_domains(domains: Mapping[int, str], reference: str | None) -> None:
    """UserError unless every engine (rank -> domain) and the reference draw the same directions."""
    found = sorted(set(domains.values()) | ({reference} if reference is not None else set()))
    if len(found) > 1:
        where = ", ".join(f"engine {r}: {d}" for r, d in sorted(domains.items()))
        ref = f"; trainer: {reference}" if reference is not None else ""
        raise UserError(f"the engines draw different directions from the same seeds ({where}{ref}); a pool needs "
                        "one device type and GPU model, and the trainer's `device` must match the engines' "
                        "(docs/es.md, \"Directions on the device\")")


def policy_state(policy: Any) -> StateFiles:
    """The files :meth:`HFPolicy.save` writes, read back as bytes, plus theta_0 of anchored ES
    (:meth:`HFPolicy.save_anchor`: engines pull toward the run's start weights, not their own start state)."""
    with tempfile.TemporaryDirectory(prefix="esreason-state-") as tmp:
        policy.save(tmp)
        policy.save_anchor(tmp)
        root = Path(tmp)
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def state_key(state: Mapping[str, bytes]) -> str:
    """A content digest of checkpoint files (names and bytes): equal states share one directory."""
    digest = hashlib.sha256()
    for name, data in sorted(state.items()):
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()[:24]


def shared_state_root(root: str | Path | None = None) -> Path:
    """Where start states are written once per node (``ESREASON_ENGINE_DIR`` or the temp dir)."""
    import os

    return Path(root or os.environ.get("ESREASON_ENGINE_DIR") or tempfile.gettempdir()) / "esreason-state"


def shared_state_dir(state: Mapping[str, bytes], root: str | Path | None = None) -> Path:
    """The files of ``state`` in one directory per node, keyed by their content.

    Every engine of a pool starts from the same state; a directory per engine would hold it once
    per engine (8 engines of a 1.5B model with fp32 masters: about 72 GB on one disk).
    The first engine of a node writes it (to a staging directory, renamed into place under a file
    lock, so no engine ever reads a half-written state); the others find it complete and read it.
    The directory lives until :func:`remove_shared_state` (the pool's close) or the temp dir's own
    cleanup; a restarted engine finds it again.
    """
    return write_once(shared_state_root(root) / state_key(state), lambda: state)


def write_once(out: Path, files: Callable[[], Mapping[str, bytes]]) -> Path:
    """Directory ``out`` holding ``files()``, written by the first caller on the node under a file
    lock (the others wait, then find ``.complete`` and never call ``files``)."""
    import os
    import shutil

    from filelock import FileLock

    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if (out / ".complete").is_file():
            return out
        staging = out.parent / f".{out.name}.{os.getpid()}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        write_state(files(), staging)
        (staging / ".complete").write_bytes(b"")
        shutil.rmtree(out, ignore_errors=True)
        os.replace(staging, out)
    return out


def start_directory(state: StartState) -> Path:
    """The complete start-state directory on this node: a :class:`StateDir`'s own (UserError naming
    it when incomplete: the engine's host fetches the bytes first, ``ray_pool.local_state``), or
    the node's shared copy of the bytes (:func:`shared_state_dir`)."""
    if not isinstance(state, StateDir):
        return shared_state_dir(state)
    out = Path(state.path)
    if not (out / ".complete").is_file():
        raise UserError(f"start state {out} is not on this node (no {out / '.complete'}); "
                        "the pool writes it on its own node and sends the bytes for the others")
    return out


def state_config_files(state: StartState) -> StateFiles:
    """The state's small files (config, tokenizer: all but ``*.safetensors``) as bytes."""
    if not isinstance(state, StateDir):
        return {n: d for n, d in state.items() if not n.endswith(".safetensors")}
    root = start_directory(state)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith(".safetensors") and p.name != ".complete"}


def remove_shared_state(state: Mapping[str, bytes] | str, root: str | Path | None = None) -> None:
    """Remove the node's shared copy of ``state`` (a state or its :func:`state_key`), if any."""
    import shutil

    from filelock import FileLock

    key = state if isinstance(state, str) else state_key(state)
    out = shared_state_root(root) / key
    with FileLock(str(out) + ".lock"):
        shutil.rmtree(out, ignore_errors=True)
    Path(str(out) + ".lock").unlink(missing_ok=True)


def write_state(state: Mapping[str, bytes], directory: str | Path) -> Path:
    """Write checkpoint files from :func:`policy_state` into ``directory`` (created)."""
    root = Path(directory)
    for name, data in state.items():
        path = (root / name).resolve()
        if root.resolve() not in path.parents:
            raise ValueError(f"state file name escapes the directory: {name!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


@dataclass(frozen=True)
class HFEngineOptions:
    """How an :class:`HFEngine` builds its policy (mirrors the run config)."""

    dtype: str = "float32"
    device: str = "cpu"
    restore: str = "exact"
    master_weights: str = "auto"
    direction_cache_mb: int = 256
    generation_batch_size: int = 256
    threads: int = 1
    perturbation: str = "full"
    rank: int = 1
    anchor_decay: float = 0.0

    @classmethod
    def from_config(cls, cfg: Any, threads: int = 1) -> "HFEngineOptions":
        es = cfg.es
        return cls(dtype=cfg.dtype, device=cfg.device, restore=es.restore, master_weights=es.master_weights,
                   direction_cache_mb=es.direction_cache_mb, generation_batch_size=cfg.generation.batch_size,
                   threads=threads, perturbation=es.perturbation, rank=es.rank, anchor_decay=es.anchor_decay)


class HFEngine:
    """A transformers model + :class:`HFPolicy` + :class:`Sampler`, rebuilt from checkpoint files."""

    def __init__(self, options: HFEngineOptions, state: StartState) -> None:
        self.options = options
        self.group: Any = None  # the pool's process group (sharded update), after join_group
        torch.set_num_threads(max(1, int(options.threads)))
        self.load_state(state)

    def load_state(self, state: StartState) -> None:
        from esreason.backends.hf import HFPolicy, load_model
        from esreason.backends.sampling import Sampler

        o = self.options
        start = str(start_directory(state))  # one copy per node, shared by its engines
        model, tokenizer = load_model(start, o.dtype, o.device)
        policy = HFPolicy(model, tokenizer, restore=o.restore, master_weights=o.master_weights,
                          direction_cache_mb=o.direction_cache_mb, perturbation=o.perturbation, rank=o.rank,
                          anchor_decay=o.anchor_decay)
        policy.load_masters(start)
        policy.load_anchor(start)  # theta_0 travels with the state (policy_state); anchored ES only
        self.policy = policy
        self.sampler = Sampler(model, tokenizer, batch_size=o.generation_batch_size)

    def run_member(self, index: int, seed: int, sigma: float, prompts: Sequence[str],
                   params: SamplingParams) -> MemberOutput:
        self.policy.perturb(seed, sigma)
        try:
            t0 = time.perf_counter()
            gen: Generation = self.sampler.generate(prompts, params)
            seconds = time.perf_counter() - t0
        finally:
            self.policy.restore()
        return MemberOutput.of(index, gen, seconds)

    def apply_update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float) -> float:
        norm = self.policy.apply_update(seeds, weights, alpha)
        self.policy.params.pop_timings()
        return norm

    def join_group(self, spec: Any) -> None:
        from esreason.backends.collective import EngineGroup

        old, self.group = getattr(self, "group", None), None  # drop the old group first (its peers may be gone)
        if old is not None:
            old.close()
        self.group = EngineGroup(spec, next(self.policy.model.parameters()).device)

    def apply_update_sharded(self, seeds: Sequence[int], weights: Sequence[float], alpha: float,
                             num_shards: int, shards: Sequence[int]) -> float:
        from esreason.es.sharded import Sharding

        if self.group is None:
            raise RuntimeError("apply_update_sharded before join_group")
        sharding = Sharding(int(num_shards), tuple(int(k) for k in shards), self.group.all_reduce_)
        norm = self.policy.apply_update(seeds, weights, alpha, sharding)
        self.policy.params.pop_timings()
        return norm

    def checksum(self) -> str:
        return policy_checksum(self.policy)

    def noise_domain(self) -> str:
        return policy_noise_domain(self.policy)

    def export_state(self) -> StateFiles:
        return policy_state(self.policy)


class ResultCollector:
    """Scores member outputs on the driver as they arrive and assembles a ``PopulationResult``.

    Scoring runs where the trainer's verifier lives (the driver): engines return texts, so
    verifiers never need to be shipped to workers (math-verify's timeouts use
    ``signal.alarm``, which fails outside a process's main thread).
    """

    def __init__(self, size: int, golds: Sequence[Any], scorer: Any) -> None:
        self.golds = list(golds)
        self.scorer = scorer
        b = len(self.golds)
        self.rewards = np.zeros((size, b), dtype=np.float64)
        self.correct = np.zeros((size, b), dtype=bool)
        self.formatted = np.zeros((size, b), dtype=bool)
        self.done = np.zeros(size, dtype=bool)
        self.lengths: np.ndarray | None = np.zeros((size, b), dtype=np.int64)
        self.tokens = 0
        self.engine_seconds = 0.0
        self.reward_seconds = 0.0

    def add(self, out: MemberOutput) -> None:
        if self.done[out.index]:
            raise RuntimeError(f"member {out.index} was evaluated twice")
        if len(out.texts) != len(self.golds):
            raise RuntimeError(f"member {out.index}: {len(out.texts)} responses for {len(self.golds)} prompts")
        t0 = time.perf_counter()
        for j, v in enumerate(score_texts(self.scorer, out.texts, self.golds)):  # one call per member
            self.rewards[out.index, j], self.correct[out.index, j], self.formatted[out.index, j] = (
                v.reward, v.correct, v.formatted)
        self.reward_seconds += time.perf_counter() - t0
        self.done[out.index] = True
        if self.lengths is not None and len(out.lengths) == len(self.golds):
            self.lengths[out.index] = out.lengths
        else:  # an engine that does not report them: the update has no length record
            self.lengths = None
        self.tokens += out.num_tokens
        self.engine_seconds += out.seconds

    def result(self, wall_seconds: float) -> Any:
        """The ``PopulationResult``; timings: generate = wall time of the evaluation minus
        driver-side scoring, engine_generate = summed engine generate time."""
        missing = np.flatnonzero(~self.done)
        if missing.size:
            raise RuntimeError(f"members {missing.tolist()} were never evaluated")
        timings = {"generate": max(0.0, wall_seconds - self.reward_seconds), "reward": self.reward_seconds,
                   "engine_generate": self.engine_seconds}
        return PopulationResult(self.rewards, self.correct, self.formatted, self.tokens, timings, self.lengths)
