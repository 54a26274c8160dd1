"""The population decode loop: P members' greedy or sampled decoding of one prompt chunk.

Used by :class:`esreason.backends.batched.BatchedEvaluator` (``backend.type: batched``); the
module docstring there explains why the loop keeps members whose sequential row count falls
below ``EXACT_ROWS_BELOW`` in separate blocks (bit-identity with the sequential sampler on
CPU). This module holds only the decode state machine: blocks of member positions, their KV
caches, compaction and moves between blocks, and the per-step sampling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from esreason.backends import topp
from esreason.backends.base import SamplingParams
from esreason.backends.popmodel import PopulationKV, PopulationModel
from esreason.backends.sampling import COMPACT_BELOW, chunk_generator

# GEMMs with fewer rows than this use a different kernel (gemv for 1 row, another
# micro-kernel for 2-3) whose per-row bits differ from the >= 4 rows path (MKL fp32, CPU;
# measured with torch 2.13). Members whose sequential row count is below it get their own
# block with exactly that row count.
EXACT_ROWS_BELOW = 4
_MAIN = 0  # block key of the main block (rows per member >= EXACT_ROWS_BELOW)
# The main block drops its dummy slots (a copy of its KV cache) once real slots fall to this
# share. Efficiency only: results do not depend on it. Lower than the sequential sampler's
# COMPACT_BELOW because a rebuild here copies the cache of all members at once.
MAIN_COMPACT_BELOW = 0.75



# --------------------------------------------------------------------------- decode state


@dataclass
class _Block:
    """Member positions sharing one GEMM shape: ``slots`` rows per member position.

    weights: name -> [cap, *shape]; positions 0..used-1 are in use (holes have member -1).
    member: [cap] group member index per position (-1 = hole).
    row: [cap, slots] chunk row of each slot (-1 = dummy slot: fed, result ignored).
    cache / mask [cap*slots, capacity] / next_pos [cap*slots]: per-slot decode state.
    logits: [used*slots, V] of the last forward.
    """

    key: int
    slots: int
    weights: dict[str, torch.Tensor]
    member: torch.Tensor
    row: torch.Tensor
    cache: PopulationKV
    mask: torch.Tensor
    next_pos: torch.Tensor
    used: int
    logits: torch.Tensor | None = None

    @property
    def cap(self) -> int:
        return int(self.member.shape[0])

    @property
    def num_slots(self) -> int:
        return self.used * self.slots


@dataclass
class DecodeStats:
    """Counters of the last population decode (benchmarks): forwards per block kind, rebuilds."""

    forwards: int = 0
    small_block_forwards: int = 0
    rebuilds: int = 0
    moves: int = 0
    slot_steps: int = 0  # sum over forwards of rows computed (incl. dummy slots)
    seconds: dict[str, float] = field(default_factory=dict)


class ChunkDecoder:
    """Greedy or sampled decoding of one prompt chunk for P members at once (see module docstring)."""

    def __init__(self, pm: PopulationModel, weights: dict[str, torch.Tensor], rows: list[list[int]],
                 budgets: list[int], params: Sequence[SamplingParams], chunk: int, *, stop_ids: list[int],
                 pad_id: int, max_positions: int | None, compact: bool, stats: DecodeStats) -> None:
        self.pm, self.weights, self.rows, self.params = pm, weights, rows, params
        self.p, self.b0 = len(params), len(rows)
        self.dev = pm.device
        self.budget = torch.tensor(budgets, dtype=torch.long, device=self.dev)  # [b0]
        self.steps = max(budgets)
        self.plen = max(len(r) for r in rows)
        self.stop = torch.tensor(stop_ids, dtype=torch.long, device=self.dev)  # [S]
        self.pad_id = pad_id
        self.max_pos = (max_positions - 1) if max_positions is not None else None
        self.compact = compact
        self.stats = stats
        self.temperature = float(params[0].temperature)
        self.top_p = float(params[0].top_p)
        self.gens = ([chunk_generator(pr.seed, chunk) for pr in params] if self.temperature > 0 else None)
        self.blocks: dict[int, _Block] = {}
        self.length = 0  # positions held by every block's cache
        self.where: list[tuple[int, int]] = []  # member -> (block key, position)

    # ------------------------------------------------------------------ blocks
    def _key(self, rows: int) -> int:
        return rows if rows < EXACT_ROWS_BELOW else _MAIN

    def _empty_block(self, key: int) -> _Block:
        """A small block with room for every member (pages are touched only when used)."""
        p, k, cap_t = self.p, key, self.plen + self.steps
        weights = {n: torch.empty((p, *t.shape[1:]), dtype=t.dtype, device=t.device) for n, t in self.weights.items()}
        return _Block(key=key, slots=k, weights=weights, member=torch.full((p,), -1, dtype=torch.long),
                      row=torch.full((p, k), -1, dtype=torch.long), cache=self.pm.new_cache(p * k, cap_t),
                      mask=torch.ones((p * k, cap_t), dtype=torch.bool, device=self.dev),
                      next_pos=torch.zeros(p * k, dtype=torch.long, device=self.dev), used=0)

    def _rebuild(self, blk: _Block, positions: list[int], slots: int, sources: list[list[int]]) -> _Block:
        """A block with the given old positions, ``slots`` slots each; ``sources[q][j]`` is the old
        slot feeding new slot (q, j) and -1 marks a dummy (it copies the position's first source)."""
        self.stats.rebuilds += 1
        flat, rows = [], []
        for q, pos in enumerate(positions):
            first = next((s for s in sources[q] if s >= 0), 0)
            for j in range(slots):
                s = sources[q][j]
                flat.append(s if s >= 0 else first)
                rows.append(int(blk.row.view(-1)[s]) if s >= 0 else -1)
        idx = torch.tensor(flat, dtype=torch.long, device=self.dev)  # [new slots]
        pos_t = torch.tensor(positions, dtype=torch.long)
        if positions == list(range(len(positions))):
            weights = {n: t[:len(positions)] for n, t in blk.weights.items()}  # prefix view, no copy
        else:
            weights = {n: t.index_select(0, pos_t.to(t.device)) for n, t in blk.weights.items()}
        return _Block(key=blk.key, slots=slots, weights=weights, member=blk.member[pos_t].clone(),
                      row=torch.tensor(rows, dtype=torch.long).view(len(positions), slots),
                      cache=blk.cache.gathered(idx, self.length), mask=blk.mask.index_select(0, idx),
                      next_pos=blk.next_pos.index_select(0, idx), used=len(positions))

    def _reindex(self, blk: _Block) -> None:
        for q in range(blk.used):
            m = int(blk.member[q])
            if m >= 0:
                self.where[m] = (blk.key, q)

    def _compact_main(self, blk: _Block) -> _Block | None:
        """Drop dummy slots of the main block once real slots fall to MAIN_COMPACT_BELOW of its slots."""
        real = blk.row[:blk.used] >= 0  # [used, slots]
        n_real = int(real.sum())
        if n_real == 0:
            return None
        if n_real > MAIN_COMPACT_BELOW * blk.num_slots:
            return blk
        per = real.sum(1).tolist()
        live = [q for q in range(blk.used) if per[q] > 0]
        holes = blk.used - len(live)
        positions = list(range(blk.used)) if holes * 4 < blk.used else live  # few holes: keep, no weight copy
        slots = max(EXACT_ROWS_BELOW, max(per))
        sources = []
        for q in positions:
            src = [q * blk.slots + j for j in range(blk.slots) if bool(real[q, j])]
            sources.append(src + [-1] * (slots - len(src)))
        new = self._rebuild(blk, positions, slots, sources)
        self._reindex(new)
        return new

    def _compact_small(self, blk: _Block) -> _Block:
        """Remove holes of a small block (slots per member unchanged)."""
        live = [q for q in range(blk.used) if int(blk.member[q]) >= 0]
        sources = [[q * blk.slots + j if int(blk.row[q, j]) >= 0 else -1 for j in range(blk.slots)] for q in live]
        for q, src in zip(live, sources):  # a position whose rows are all dummies still needs a source
            if all(s < 0 for s in src):
                src[0] = q * blk.slots
        new = self._rebuild(blk, live, blk.slots, sources)
        grown = self._empty_block(blk.key)
        n, k = new.used, new.slots
        for name, t in new.weights.items():
            grown.weights[name][:n].copy_(t)
        grown.member[:n] = new.member
        grown.row[:n] = new.row
        dst = torch.arange(n * k, device=self.dev)
        grown.cache.copy_rows(dst, new.cache, dst, self.length)
        grown.mask[:n * k] = new.mask
        grown.next_pos[:n * k] = new.next_pos
        grown.used = n
        self._reindex(grown)
        return grown

    def _move(self, m: int, key: int, running_rows: list[int]) -> None:
        """Move member m (exactly ``key`` running rows) into the small block ``key``."""
        self.stats.moves += 1
        skey, spos = self.where[m]
        src = self.blocks[skey]
        dst = self.blocks.get(key)
        if dst is None:
            dst = self.blocks[key] = self._empty_block(key)
        if dst.used == dst.cap:
            dst = self.blocks[key] = self._compact_small(dst)
        q = dst.used
        dst.used += 1
        for name, t in src.weights.items():
            dst.weights[name][q].copy_(t[spos])
        srow = src.row[spos].tolist()
        s_idx = [spos * src.slots + srow.index(r) for r in running_rows]
        d_idx = [q * key + j for j in range(key)]
        s_t = torch.tensor(s_idx, dtype=torch.long, device=self.dev)
        d_t = torch.tensor(d_idx, dtype=torch.long, device=self.dev)
        dst.cache.copy_rows(d_t, src.cache, s_t, self.length)
        dst.mask[d_t] = src.mask[s_t]
        dst.next_pos[d_t] = src.next_pos[s_t]
        dst.member[q] = m
        dst.row[q] = torch.tensor(running_rows, dtype=torch.long)
        src.member[spos] = -1
        src.row[spos] = -1
        self.where[m] = (key, q)

    # ------------------------------------------------------------------ forward
    def _forward(self, blk: _Block, tokens: torch.Tensor, past: int) -> None:
        """Run the block's used positions: tokens [used*slots, T] ids; stores logits [used*slots, V]."""
        n, k = blk.used, blk.slots
        t = tokens.shape[-1]
        s = n * k
        if t == 1:
            pos = blk.next_pos[:s] if self.max_pos is None else blk.next_pos[:s].clamp(max=self.max_pos)
            pos = pos.view(n, k, 1)
        else:
            pos = self._prefill_pos.expand(n, k, t)
        w = {name: wt[:n] for name, wt in blk.weights.items()}  # [n, *shape] prefix views
        logits = self.pm.forward(w, tokens.view(n, k, t), pos, blk.mask[:s, :past + t], blk.cache, past)
        blk.logits = logits.reshape(s, -1)  # [S, V]
        self.length = past + t
        self.stats.forwards += 1
        self.stats.small_block_forwards += int(blk.key != _MAIN)
        self.stats.slot_steps += s

    def run(self) -> tuple[list[list[list[int]]], int]:
        """Decode; returns (tokens[member][row], forwards)."""
        p, b0, plen, steps, dev = self.p, self.b0, self.plen, self.steps, self.dev
        ids = torch.full((b0, plen), self.pad_id, dtype=torch.long)
        mask0 = torch.ones((b0, plen + steps), dtype=torch.bool)
        for j, r in enumerate(self.rows):
            ids[j, plen - len(r):] = torch.tensor(r, dtype=torch.long)
            mask0[j, :plen - len(r)] = False
        pos0 = (mask0[:, :plen].long().cumsum(-1) - 1).clamp_(min=0)  # [b0, plen]
        ids, mask0, pos0 = ids.to(dev), mask0.to(dev), pos0.to(dev)
        self._prefill_pos = pos0.unsqueeze(0)  # [1, b0, plen]

        key0 = self._key(b0)
        main = _Block(key=key0, slots=b0, weights=self.weights, member=torch.arange(p),
                      row=torch.arange(b0).repeat(p, 1), cache=self.pm.new_cache(p * b0, plen + steps),
                      mask=mask0.repeat(p, 1), next_pos=(pos0[:, -1] + 1).repeat(p), used=p)
        self.blocks = {key0: main}
        self.where = [(key0, i) for i in range(p)]
        self._forward(main, ids.repeat(p, 1), 0)

        seq_rows = [b0] * p  # rows the sequential sampler would feed for each member
        done = [False] * p
        finished = torch.zeros((p, b0), dtype=torch.bool, device=dev)
        out_len = torch.zeros((p, b0), dtype=torch.long, device=dev)
        out_tok = torch.zeros((p, b0, max(steps, 1)), dtype=torch.long, device=dev)
        uniforms = torch.zeros((p, b0), dtype=torch.float32)
        for step in range(steps):
            if self.gens is not None:
                for i in range(p):
                    if not done[i]:
                        uniforms[i] = torch.rand(b0, generator=self.gens[i])  # sequential: one per row and step
            toks = torch.zeros((p, b0), dtype=torch.long, device=dev)
            for blk in self.blocks.values():
                if blk.used == 0 or blk.logits is None:
                    continue
                mem = blk.member[:blk.used].repeat_interleave(blk.slots)  # [S]
                row = blk.row[:blk.used].reshape(-1)  # [S]
                real = (row >= 0).nonzero().squeeze(-1)
                if real.numel() == 0:
                    continue
                mem_r, row_r = mem[real], row[real]
                logits = blk.logits.index_select(0, real.to(blk.logits.device))  # [S', V]
                if self.gens is None:
                    tok = topp.greedy(logits)
                else:
                    log_probs = topp.scaled_log_probs(logits, self.temperature)
                    tok = topp.sample(log_probs, self.top_p, uniforms[mem_r, row_r])
                tok.clamp_(0, logits.shape[-1] - 1)
                toks[mem_r.to(dev), row_r.to(dev)] = tok
            active = ~finished
            emit = active.clone()
            if self.stop.numel():
                emit &= ~torch.isin(toks, self.stop)
            out_tok[:, :, step] = toks
            out_len += emit.long()
            running = emit & (out_len < self.budget)  # [p, b0]
            finished = ~running
            n_run = running.sum(1).tolist()
            running_cpu = running.cpu()
            for i in range(p):
                if done[i]:
                    continue
                if n_run[i] == 0:
                    done[i] = True
                    key, pos = self.where[i]
                    self.blocks[key].member[pos] = -1
                    self.blocks[key].row[pos] = -1
                    continue
                if self.compact and n_run[i] <= COMPACT_BELOW * seq_rows[i]:
                    seq_rows[i] = n_run[i]
                    new_key = self._key(n_run[i])
                    if new_key != _MAIN:  # small blocks hold exactly the sequential row count
                        self._move(i, new_key, running_cpu[i].nonzero().squeeze(-1).tolist())
            if all(done):
                break
            # finished rows become dummy slots (still fed when the sequential sampler feeds them)
            for blk in self.blocks.values():
                if blk.used:
                    r = blk.row[:blk.used]
                    m = blk.member[:blk.used].unsqueeze(1).expand_as(r)
                    ok = (r >= 0) & running_cpu[m.clamp(min=0), r.clamp(min=0)]
                    blk.row[:blk.used] = torch.where(ok, r, torch.full_like(r, -1))
            if self.compact and _MAIN in self.blocks:
                new_main = self._compact_main(self.blocks[_MAIN])
                if new_main is None:
                    del self.blocks[_MAIN]
                else:
                    self.blocks[_MAIN] = new_main
            for key in list(self.blocks):
                blk = self.blocks[key]
                if key != _MAIN and blk.used and 2 * int((blk.member[:blk.used] < 0).sum()) > blk.used:
                    self.blocks[key] = self._compact_small(blk)
            # feed the chosen tokens
            past = plen + step
            toks_cpu = toks.cpu()
            for blk in self.blocks.values():
                if blk.used == 0:
                    continue
                has_member = blk.member[:blk.used] >= 0
                if not bool(has_member.any()):
                    blk.logits = None
                    continue
                mem = blk.member[:blk.used].repeat_interleave(blk.slots).clamp(min=0)
                row = blk.row[:blk.used].reshape(-1)
                feed = toks_cpu[mem, row.clamp(min=0)]
                feed = torch.where(row >= 0, feed, torch.full_like(feed, self.pad_id)).to(dev)
                self._forward(blk, feed.unsqueeze(-1), past)
                blk.next_pos[:blk.num_slots] += 1
        lengths = out_len.tolist()
        toks_l = out_tok.cpu().tolist()
        return [[toks_l[i][j][:lengths[i][j]] for j in range(b0)] for i in range(p)], self.stats.forwards
