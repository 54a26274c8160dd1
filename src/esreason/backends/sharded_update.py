"""The Ray pool's sharded update (``backend.update: sharded``; docs/internals.md, "Sharded update").

With the replicated update every engine redraws all N directions; here each of the E
engines sums only its shards of the population and the engines add the sums with one
int64 all-reduce per noise block (:mod:`esreason.es.sharded` has the arithmetic and why it
is exact). One update:

1. (Re)build the engines' process group if the set of live engines changed
   (:mod:`esreason.backends.collective`; the driver hosts the store).
2. Start the trainer's reference update in a background thread: the reference sums all
   shards itself (no collective) and gets the same bits. It overlaps the engines' update
   and the next evaluation; :meth:`wait_reference` joins it before anything reads the
   reference (checkpoints, held-out evaluation, checksums, the next update).
3. Every live engine j of E applies shards ``assign_shards(num_shards, E, j)`` and returns
   its norm (all equal).

Faults: an engine that dies before or during the collective makes the others' collective
fail (gloo: the peer's socket closes; NCCL: the timeout). Their centres may then be half
updated, so every live engine is re-loaded from the reference state once the reference's
update is done, and the group is rebuilt for the next update. The update itself is not
lost: it is the reference's, and it depends only on ``num_shards``, not on which engines
survived.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Sequence

from esreason.backends.collective import GroupSpec, host_store
from esreason.es.sharded import Sharding, assign_shards

log = logging.getLogger(__name__)


class ShardedUpdate:
    """The sharded update of a :class:`~esreason.backends.ray_pool.RayEnginePool` (see the module docstring)."""

    def __init__(self, pool: Any, timeout_s: float = 600.0) -> None:
        self.pool = pool
        self.timeout_s = float(timeout_s)
        self.num_shards = int(pool.engines)
        self.store: Any = None
        self.host: str | None = None
        self.members: tuple[int, ...] | None = None  # engine ranks of the current group, in group order
        self.generation = 0
        self.failures = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="esreason-reference-update")
        self._reference: Future | None = None

    # ------------------------------------------------------------------ the group

    def _ensure_group(self) -> None:
        pool, ray = self.pool, self.pool.ray
        ranks = tuple(s.rank for s in pool.slots)
        if ranks == self.members:
            return
        if self.store is None:
            self.host = ray.util.get_node_ip_address()
            self.store = host_store(self.host, self.timeout_s)
        self.generation += 1
        slots = list(pool.slots)
        specs = [GroupSpec(self.host, int(self.store.port), f"esreason-pool/{self.generation}", j, len(slots),
                           self.timeout_s) for j in range(len(slots))]
        refs = [slot.actor.join_group.remote(spec) for slot, spec in zip(slots, specs)]
        try:
            ray.get(refs)
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError):
            # An engine died while joining; the live ones fail once the store times out. Drop the
            # dead (RayActorError) and build the group again over the rest.
            lost = 0
            for slot, ref in zip(slots, refs):
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    pool._lose(slot, exc)
                    lost += 1
                except ray.exceptions.RayTaskError:
                    pass  # alive; its join failed because a peer was missing
            if not lost:
                raise RuntimeError(f"ray pool: the engines could not form group {self.generation}") from None
            self.members = None
            self._ensure_group()
            return
        self.members = ranks
        log.info("ray pool: sharded update group %d over engines %s", self.generation, list(ranks))

    # ------------------------------------------------------------------ the reference

    def wait_reference(self) -> float | None:
        """Join the reference's background update (re-raising its error); its norm, or None."""
        future, self._reference = self._reference, None
        return None if future is None else future.result()

    def _start_reference(self, seeds: list[int], weights: list[float], alpha: float) -> None:
        ref = self.pool.reference
        if ref is not None:
            self._reference = self._executor.submit(ref.apply_update, seeds, weights, alpha,
                                                    Sharding.local(self.num_shards))

    # ------------------------------------------------------------------ one update

    def apply(self, seeds: Sequence[int], weights: Sequence[float], alpha: float, step: int) -> float:
        """Apply the update on every engine (and the reference); returns ||delta||_2."""
        pool, ray = self.pool, self.pool.ray
        seeds, weights, alpha = [int(s) for s in seeds], [float(w) for w in weights], float(alpha)
        pool._settle()
        self.wait_reference()
        self._start_reference(seeds, weights, alpha)
        self._ensure_group()
        slots = list(pool.slots)
        refs = [slot.actor.apply_update_sharded.remote(seeds, weights, alpha, self.num_shards,
                                                       assign_shards(self.num_shards, len(slots), j))
                for j, slot in enumerate(slots)]
        norms: list[float] = []
        failed = False
        for slot, ref in zip(slots, refs):
            try:
                norms.append(float(ray.get(ref)))
            except ray.exceptions.RayActorError as exc:
                pool._lose(slot, exc)
                failed = True
            except ray.exceptions.RayTaskError as exc:
                log.warning("ray pool: engine %d's sharded update failed (%s)", slot.rank,
                            str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__)
                failed = True
        if failed:
            return self._recover(step)
        if len(set(norms)) > 1:
            log.warning("ray pool: update %d: engines report different update norms %s", step + 1, norms)
        return norms[0]

    def _recover(self, step: int) -> float:
        """After a failed collective: re-load every live engine from the reference's updated centre."""
        pool = self.pool
        self.failures += 1
        self.members = None
        if pool.reference is None:
            raise RuntimeError(f"update {step + 1}: a sharded update failed and the pool has no reference "
                               "centre to restore the engines from")
        norm = self.wait_reference()
        state_ref = pool.ray.put(pool._reference_state())
        pool.ray.get([slot.actor.load_state.remote(state_ref) for slot in pool.slots])
        pool.stats.rebroadcasts += len(pool.slots)
        log.warning("ray pool: update %d: sharded update failed; %d engines re-loaded from the reference",
                    step + 1, len(pool.slots))
        return float(norm)

    def close(self) -> None:
        """Finish the reference's update and drop the store (an error in that update is logged:
        close runs while unwinding, and must not hide the error that stopped the run)."""
        try:
            self.wait_reference()
        except Exception as exc:  # noqa: BLE001 - reported, the pool is being torn down
            log.error("ray pool: the trainer's background update failed: %s", exc)
        finally:
            self._executor.shutdown(wait=True)
            self.store = None
