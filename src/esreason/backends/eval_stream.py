"""Streamed evaluation on engines: each engine gets its whole share at once.

The call-by-call evaluation (:meth:`esreason.backends.vllm_eval.EngineGenerator.generate`) makes
every engine wait, call after call, for the longest row of the call, then for its greedy call, its
entropy pass and the driver's verification. Streamed, the harness hands over every unanswered
problem at once as a :class:`RequestGroup` (one prompt; its M sampled rows, one request seed each;
its greedy row), the driver deals the groups into one share per engine, and:

- a vLLM engine adds every row of its share to its ``LLMEngine`` and steps it until none is left
  (vLLM schedules continuously: a finished row's slot is refilled at once). A group whose rows
  are all finished goes to a scoring thread (the teacher-forced entropy pass, each prompt once for
  its samples) while generation goes on, and comes back as a :class:`GroupOutput`;
- the driver takes finished groups from every engine as they come (:class:`StreamRunner`: a thread
  and a queue, in the engine's Ray actor or in this process), verifies them and appends them to the
  task's ``responses.jsonl`` at once, so a kill loses only the groups in flight.

Row seeds are the call path's: row j of problem i of call c is sampled with
``request_seeds(call_seed(seed, task, c), rows of call c)[i * M + j]`` and the greedy row with
``request_seeds(0, problems of call c)[i]``, so a row's seed never depends on how rows are batched
or on which engine runs it. The HF twin engine samples each row alone with its seed and so gives
identical responses streamed or by calls, resumed or not. vLLM is not batch-invariant: a row's
logits, and so rarely its tokens, can change with what else is in the batch; each row's request
seed is recorded (``request_seed`` in responses.jsonl) so any row can be regenerated alone.

Each engine reports ``active_s`` (first row added to last row finished: the engine had unfinished
rows all along, so it was generating) against the driver's evaluation wall time.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from esreason.backends.base import SamplingParams
from esreason.backends.request_rows import sampler_generate_requests, strip_stop


@dataclass(frozen=True)
class RequestGroup:
    """One problem's rows for an engine."""

    key: int
    """The driver's index of the group."""
    prompt_ids: list[int]
    """The chat-rendered prompt, tokenised without special tokens."""
    seeds: list[int]
    """One request seed per sampled row (M rows)."""
    greedy_seed: int | None
    """The greedy row's request seed, or None for no greedy row."""


@dataclass(frozen=True)
class GroupOutput:
    """One problem's responses (token ids without the stop token)."""

    key: int
    token_ids: list[list[int]]
    """The M sampled rows."""
    entropy_sum: list[float] | None
    """Entropy sums of the sampled rows (None when not asked)."""
    greedy_ids: list[int] | None
    """The greedy row, or None."""


@dataclass
class StreamCounters:
    """What one engine did in one stream."""

    active_s: float = 0.0
    """First row added to last row finished (the engine generating all along)."""
    score_s: float = 0.0
    """Seconds in the entropy pass (overlapping generation on the vLLM engine)."""
    row_s: float = 0.0
    """Integral over engine steps of the rows in flight (vLLM): ``row_s / active_s`` is the mean
    number of rows the engine was decoding."""
    rows: int = 0
    groups: int = 0

    def as_dict(self) -> dict[str, float | int]:
        return {"active_s": round(self.active_s, 4), "score_s": round(self.score_s, 4), "rows": self.rows,
                "groups": self.groups, "row_s": round(self.row_s, 4)}


def split_groups(groups: Sequence[RequestGroup], engines: int) -> list[list[RequestGroup]]:
    """One share per engine, group i to engine i mod E (empty shares dropped). Dealt round-robin, not
    in blocks: the groups come task by task, and tasks differ in response length, so blocks would
    give one engine the long task and leave the other idle at the end."""
    e = max(1, engines)
    return [list(groups[k::e]) for k in range(e) if groups[k::e]]


# ----------------------------------------------------------------------------- engines


def step_rows(engine: Any, owner: dict[str, Any], counters: StreamCounters | None = None,
              stop: threading.Event | None = None) -> Iterator[tuple[str, Any]]:
    """Step a vLLM ``LLMEngine`` until the requests in ``owner`` are finished; yields (request id,
    its first completion) as each finishes. ``counters.row_s`` adds the rows in flight x step time.
    ``stop``: abort the unfinished requests and return."""
    left = set(owner)
    while left and engine.has_unfinished_requests():
        if stop is not None and stop.is_set():
            engine.abort_request(sorted(left))
            return
        t0 = time.perf_counter()
        outs = engine.step()
        if counters is not None:
            counters.row_s += (time.perf_counter() - t0) * len(left)
        for out in outs:
            if out.finished and out.request_id in left:
                left.discard(out.request_id)
                yield out.request_id, out.outputs[0]


def vllm_stream(llm: Any, groups: Sequence[RequestGroup], params: SamplingParams, eos: set[int], scorer: Any,
                stop: threading.Event, counters: StreamCounters) -> Iterator[GroupOutput]:
    """Every row of ``groups`` on a ``vllm.LLM`` at once; finished groups as they complete.

    Sampled rows use ``params`` (temperature, top-p, max_new_tokens) and their own seed; greedy rows
    temperature 0. Entropies (``params.compute_entropy``) are scored by ``scorer`` (an
    :class:`~esreason.backends.scoring.EntropyScorer`) in a thread beside the engine loop.
    """
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    max_len = int(engine.model_config.max_model_len)
    owner: dict[str, tuple[int, int]] = {}  # request id -> (position in groups, row; -1 = greedy)
    sampled: list[list[list[int] | None]] = [[None] * len(g.seeds) for g in groups]
    greedy: list[list[int] | None] = [None] * len(groups)
    left = [len(g.seeds) + (g.greedy_seed is not None) for g in groups]
    scoring = _ScoringThread(scorer, params.temperature, counters) if params.compute_entropy else None
    done: "queue.Queue[GroupOutput]" = scoring.out if scoring else queue.Queue()

    def finish(pos: int) -> None:
        g = groups[pos]
        rows = [list(r or []) for r in sampled[pos]]
        if scoring is not None:
            scoring.put(g, rows, greedy[pos])
        else:
            done.put(GroupOutput(g.key, rows, None, greedy[pos]))
        counters.groups += 1

    t0 = time.perf_counter()
    for pos, g in enumerate(groups):
        budget = min(int(params.max_new_tokens), max_len - len(g.prompt_ids))
        rows = [(j, s, float(params.temperature), float(params.top_p)) for j, s in enumerate(g.seeds)]
        if g.greedy_seed is not None:
            rows.append((-1, g.greedy_seed, 0.0, 1.0))
        for j, seed, temperature, top_p in rows:
            if budget <= 0:  # the prompt fills the context: empty response (the sampler's rule)
                if j < 0:
                    greedy[pos] = []
                else:
                    sampled[pos][j] = []
                left[pos] -= 1
                continue
            rid = f"esr-stream-{g.key}-{j}"
            owner[rid] = (pos, j)
            engine.add_request(rid, {"prompt_token_ids": [int(t) for t in g.prompt_ids]},
                               VSamplingParams(temperature=temperature, top_p=top_p, max_tokens=budget,
                                               seed=int(seed), detokenize=False,
                                               output_kind=RequestOutputKind.FINAL_ONLY))
            counters.rows += 1
        if left[pos] == 0:
            finish(pos)
    try:
        for rid, choice in step_rows(engine, owner, counters, stop):
            pos, j = owner[rid]
            ids = strip_stop(choice.token_ids, choice.finish_reason, eos)
            if j < 0:
                greedy[pos] = ids
            else:
                sampled[pos][j] = ids
            left[pos] -= 1
            if left[pos] == 0:
                finish(pos)
            if scoring is not None:
                scoring.raise_error()
            yield from _drain(done)
        if stop.is_set():
            return
        counters.active_s = time.perf_counter() - t0
        if scoring is not None:
            scoring.close()  # the groups still queued are scored first (FIFO), then the thread ends
            scoring.raise_error()
        yield from _drain(done)
    finally:
        if scoring is not None:
            scoring.close()


def sampler_stream(sampler: Any, groups: Sequence[RequestGroup], params: SamplingParams, stop: threading.Event,
                   counters: StreamCounters) -> Iterator[GroupOutput]:
    """The HF twin: each row sampled alone with its seed (entropy from the sampler itself), one
    group after another."""
    t0 = time.perf_counter()
    for g in groups:
        if stop.is_set():
            return
        rows = [g.prompt_ids] * len(g.seeds)
        out = sampler_generate_requests(sampler, rows, g.seeds, params)
        greedy = None
        if g.greedy_seed is not None:
            greedy = sampler_generate_requests(sampler, [g.prompt_ids], [g.greedy_seed], SamplingParams(
                max_new_tokens=params.max_new_tokens, temperature=0.0, top_p=1.0, seed=0)).token_ids[0]
        counters.rows += len(rows) + (greedy is not None)
        counters.groups += 1
        counters.active_s = time.perf_counter() - t0
        yield GroupOutput(g.key, out.token_ids, out.entropy_sum, greedy)


def _drain(q: "queue.Queue[GroupOutput]") -> Iterator[GroupOutput]:
    while True:
        try:
            yield q.get_nowait()
        except queue.Empty:
            return


class _ScoringThread:
    """The entropy pass beside the engine loop: groups in, scored :class:`GroupOutput` out."""

    def __init__(self, scorer: Any, temperature: float, counters: StreamCounters) -> None:
        self.scorer, self.temperature, self.counters = scorer, temperature, counters
        self.inbox: "queue.Queue[Any]" = queue.Queue()
        self.out: "queue.Queue[GroupOutput]" = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="esreason-entropy", daemon=True)
        self.thread.start()

    def put(self, group: RequestGroup, rows: list[list[int]], greedy: list[int] | None) -> None:
        self.inbox.put((group, rows, greedy))

    def _run(self) -> None:
        while True:
            item = self.inbox.get()
            if item is None:
                return
            group, rows, greedy = item
            try:
                t0 = time.perf_counter()
                ent = self.scorer.entropy_sums([group.prompt_ids] * len(rows), rows, self.temperature)
                self.counters.score_s += time.perf_counter() - t0
            except Exception as exc:  # noqa: BLE001 - handed to the engine loop, which re-raises it
                self.error = exc
                return
            self.out.put(GroupOutput(group.key, rows, ent, greedy))

    def close(self) -> None:
        if self.thread.is_alive():
            self.inbox.put(None)
            self.thread.join()

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error


# ----------------------------------------------------------------------------- running a stream


_END = object()


@dataclass
class _Failure:
    error: BaseException


class StreamRunner:
    """Runs one engine's stream in a thread; :meth:`take` hands out finished groups.

    Lives in the engine's Ray actor (:class:`esreason.backends.eval_pool.EvalEngineHost`) or in the
    driver's process (one in-process engine). ``start`` gets a function of (stop event, counters)
    that returns the engine's stream iterator.
    """

    def __init__(self, start: Callable[[threading.Event, StreamCounters], Iterator[GroupOutput]]) -> None:
        self.stop_event = threading.Event()
        self.counters = StreamCounters()
        self.queue: "queue.Queue[Any]" = queue.Queue()
        self.finished = False

        def run() -> None:
            try:
                for out in start(self.stop_event, self.counters):
                    self.queue.put(out)
                self.queue.put(_END)
            except BaseException as exc:  # noqa: BLE001 - re-raised by take() in the caller's thread
                self.queue.put(_Failure(exc))

        self.thread = threading.Thread(target=run, name="esreason-eval-stream", daemon=True)
        self.thread.start()

    def take(self, timeout_s: float = 1.0) -> tuple[list[GroupOutput], dict[str, Any] | None]:
        """(finished groups, None while running | the engine's counters once its share is done).
        Blocks up to ``timeout_s`` for the first group; raises what the stream raised."""
        if self.finished:
            return [], self.counters.as_dict()
        outs: list[GroupOutput] = []
        try:
            item = self.queue.get(timeout=timeout_s)
        except queue.Empty:
            return outs, None
        while True:
            if item is _END:
                self.finished = True
                self.thread.join()
                return outs, self.counters.as_dict()
            if isinstance(item, _Failure):
                self.finished = True
                raise item.error
            outs.append(item)
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return outs, None

    def stop(self) -> None:
        """Ask the engine to abort its rows and wait for the thread."""
        self.stop_event.set()
        self.thread.join(timeout=60)


@dataclass
class StreamJob:
    """One problem for :meth:`esreason.backends.vllm_eval.EngineGenerator.stream`."""

    key: Any
    """The caller's handle (returned with the result)."""
    prompt: str
    seeds: list[int]
    greedy_seed: int | None = None


@dataclass
class StreamResult:
    """One problem's responses, decoded on the driver."""

    job: StreamJob
    texts: list[str]
    token_ids: list[list[int]]
    entropy_sum: list[float] | None
    greedy_text: str | None
    greedy_ids: list[int] | None
    engine: int = 0


class LocalStreams:
    """Streams of in-process engines (``esreason eval --engines 1``): one runner thread each."""

    def __init__(self, engines: Sequence[Any]) -> None:
        self.engines = list(engines)
        self.runners: dict[int, StreamRunner] = {}

    def start(self, k: int, groups: list[RequestGroup], params: SamplingParams) -> None:
        engine = self.engines[k]
        self.runners[k] = StreamRunner(lambda stop, counters: engine.stream_groups(groups, params, stop, counters))

    def poll(self, timeout_s: float) -> list[tuple[int, list[GroupOutput], dict[str, Any] | None]]:
        live = [(k, r) for k, r in self.runners.items() if not r.finished]
        out = []
        for k, runner in live:
            outs, counters = runner.take(timeout_s / max(1, len(live)))
            if outs or counters is not None:
                out.append((k, outs, counters))
        return out

    def stop(self) -> None:
        for runner in self.runners.values():
            runner.stop()


class RayStreams:
    """Streams of evaluation engines in Ray actors: one pending ``take`` per engine, answered as
    soon as that engine has finished groups (:class:`esreason.backends.eval_pool.EvalEngineHost`)."""

    def __init__(self, actors: Sequence[Any], ray: Any, take_timeout_s: float = 1.0) -> None:
        self.actors, self.ray, self.take_timeout_s = list(actors), ray, take_timeout_s
        self.pending: dict[Any, int] = {}  # take ref -> engine

    def start(self, k: int, groups: list[RequestGroup], params: SamplingParams) -> None:
        self.ray.get(self.actors[k].start_stream.remote(groups, params))
        self.pending[self.actors[k].take.remote(self.take_timeout_s)] = k

    def poll(self, timeout_s: float) -> list[tuple[int, list[GroupOutput], dict[str, Any] | None]]:
        if not self.pending:
            return []
        ready, _ = self.ray.wait(list(self.pending), num_returns=1, timeout=timeout_s)
        out = []
        for ref in ready:
            k = self.pending.pop(ref)
            try:
                outs, counters = self.ray.get(ref)
            except self.ray.exceptions.RayActorError as exc:
                text = str(exc).strip()
                raise RuntimeError(f"evaluation engine {k} died during the stream "
                                   f"({text.splitlines()[-1] if text else type(exc).__name__}); the problems "
                                   "already recorded stay: rerun the command to resume") from None
            if counters is None:
                self.pending[self.actors[k].take.remote(self.take_timeout_s)] = k
            out.append((k, outs, counters))
        return out

    def stop(self) -> None:
        """Stop every engine's stream (an engine already dead is skipped: the caller's error stands)."""
        for actor in self.actors:
            try:
                self.ray.get(actor.stop_stream.remote(), timeout=120)
            except self.ray.exceptions.RayError:
                pass
        self.pending.clear()
