"""Sample M responses per problem and verify them: the one code path of every evaluation.

Problems are processed task by task in *calls* of ``problems_per_call`` problems. One
call renders each problem's chat messages with the tokenizer's template
(:func:`esreason.tasks.problem_prompt`), repeats every prompt M times (problem-major:
rows ``i*M .. i*M+M-1`` are problem i), and makes one ``generate`` over the P x M rows,
plus one greedy ``generate`` over the P prompts when the protocol asks for it (paper,
appendix "Evaluation Configuration": 32 samples at temperature 0.6, and for the Easy
setting one greedy sample at temperature 0). Then all responses of the call are scored
together (:mod:`esreason.eval.verify`).

The sampling seed of a call is a hash of (protocol seed, task name, call index), so
rerunning — or resuming — an evaluation with the same protocol and batch size
regenerates identical responses on the same device type.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from esreason.backends.base import Generation, Generator, SamplingParams
from esreason.eval.answers import vote_key
from esreason.eval.records import ProblemRecord, Protocol, SampleRecord, problem_fingerprint
from esreason.eval.verify import score_batch
from esreason.tasks.base import Problem, Task, problem_prompt
from esreason.verifiers.base import Verdict

#: Rows (problem x sample prompts) per generate call when nothing else is said: one
#: batch of the default sampler batch size.
DEFAULT_ROWS_PER_CALL = 256


@dataclass(frozen=True)
class Chunk:
    """The problems of one generate call: call ``index`` of ``task``."""

    task: str
    index: int
    problems: tuple[Problem, ...]


@dataclass
class Timings:
    """Wall-clock seconds and counts accumulated over calls."""

    generate_s: float = 0.0
    verify_s: float = 0.0
    tokens: int = 0
    responses: int = 0
    calls: int = 0

    def add(self, other: "Timings") -> None:
        self.generate_s += other.generate_s
        self.verify_s += other.verify_s
        self.tokens += other.tokens
        self.responses += other.responses
        self.calls += other.calls

    def as_dict(self) -> dict[str, float | int]:
        return {"generate_s": round(self.generate_s, 4), "verify_s": round(self.verify_s, 4),
                "tokens": self.tokens, "responses": self.responses, "generate_calls": self.calls}


def problems_per_call(samples: int, rows_per_call: int = DEFAULT_ROWS_PER_CALL) -> int:
    """Problems per generate call: as many as fit ``rows_per_call`` rows, at least one."""
    return max(1, rows_per_call // samples)


def plan_chunks(problems: Sequence[Problem], per_call: int) -> list[Chunk]:
    """Split problems into calls: by task (in order of first appearance), ``per_call`` at a time."""
    by_task: dict[str, list[Problem]] = {}
    for p in problems:
        by_task.setdefault(p.task, []).append(p)
    chunks = []
    for task, items in by_task.items():
        for index, start in enumerate(range(0, len(items), per_call)):
            chunks.append(Chunk(task, index, tuple(items[start:start + per_call])))
    return chunks


def call_seed(seed: int, task: str, index: int) -> int:
    """Sampling seed of call ``index`` of ``task`` (63-bit, stable across runs and machines)."""
    digest = hashlib.sha256(f"esreason-eval/{seed}/{task}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def _check_generation(gen: Generation, rows: int, want_entropy: bool) -> None:
    if len(gen.texts) != rows or len(gen.token_ids) != rows:
        raise RuntimeError(f"generator returned {len(gen.texts)} texts / {len(gen.token_ids)} token lists "
                           f"for {rows} prompts")
    if want_entropy and gen.entropy_sum is not None and len(gen.entropy_sum) != rows:
        raise RuntimeError(f"generator returned {len(gen.entropy_sum)} entropy sums for {rows} prompts")


def run_chunk(generator: Generator, tokenizer: Any, chunk: Chunk, task: Task, protocol: Protocol,
              scorer: Callable[[str, Any], Verdict], *, workers: int = 1,
              timings: Timings | None = None) -> list[ProblemRecord]:
    """Generate and verify every response of one call; one record per problem, in order."""
    m = protocol.samples
    prompts = [problem_prompt(tokenizer, p) for p in chunk.problems]
    rows = [prompt for prompt in prompts for _ in range(m)]  # problem-major, [P*M]
    stats = Timings(calls=1)
    t0 = time.perf_counter()
    sampled = generator.generate(rows, SamplingParams(
        max_new_tokens=protocol.max_new_tokens, temperature=float(protocol.temperature),
        top_p=float(protocol.top_p), seed=call_seed(protocol.seed, chunk.task, chunk.index),
        compute_entropy=True))
    _check_generation(sampled, len(rows), True)
    greedy: Generation | None = None
    if protocol.greedy:
        greedy = generator.generate(prompts, SamplingParams(max_new_tokens=protocol.max_new_tokens,
                                                            temperature=0.0, top_p=1.0, seed=0))
        _check_generation(greedy, len(prompts), False)
        stats.calls += 1
    stats.generate_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    texts = list(sampled.texts) + (list(greedy.texts) if greedy is not None else [])
    owners = [i for i in range(len(prompts)) for _ in range(m)] + (list(range(len(prompts))) if greedy else [])
    golds = [chunk.problems[i].gold for i in owners]
    verdicts = score_batch(scorer, texts, golds, owners, workers)
    records = []
    for i, problem in enumerate(chunk.problems):
        rows = range(i * m, i * m + m)
        records.append(problem_record(
            problem, task, [sampled.texts[r] for r in rows], [len(sampled.token_ids[r]) for r in rows],
            None if sampled.entropy_sum is None else [sampled.entropy_sum[r] for r in rows],
            [verdicts[r] for r in rows],
            None if greedy is None else (greedy.texts[i], len(greedy.token_ids[i]), verdicts[len(texts) - len(prompts) + i])))
    stats.verify_s = time.perf_counter() - t0
    stats.tokens = sampled.num_tokens + (greedy.num_tokens if greedy is not None else 0)
    stats.responses = len(texts)
    if timings is not None:
        timings.add(stats)
    return records


def problem_record(problem: Problem, task: Task, texts: Sequence[str], num_tokens: Sequence[int],
                   entropy: Sequence[float] | None, verdicts: Sequence[Verdict],
                   greedy: tuple[str, int, Verdict] | None, seeds: Sequence[int] | None = None,
                   greedy_seed: int | None = None) -> ProblemRecord:
    """One problem's record from its M sampled responses (and greedy one): texts, token counts,
    entropy sums, verdicts; ``seeds``: each row's request seed where an engine sampled it alone."""
    fp = problem_fingerprint(problem)
    samples = [SampleRecord.from_verdict(problem, j, False, texts[j], num_tokens[j],
                                         None if entropy is None else entropy[j], verdicts[j],
                                         vote_key(task, verdicts[j], problem.gold), fp,
                                         None if seeds is None else seeds[j])
               for j in range(len(texts))]
    greedy_rec = None
    if greedy is not None:
        text, count, verdict = greedy
        greedy_rec = SampleRecord.from_verdict(problem, 0, True, text, count, None, verdict,
                                               vote_key(task, verdict, problem.gold), fp, greedy_seed)
    return ProblemRecord(problem.task, problem.id, samples, greedy_rec)


@dataclass
class TaskScorers:
    """Task objects and their scorers, built once per evaluation.

    tokenizer: gives reward-function tasks their ``completion_ids`` (None: empty id lists).
    """

    tasks: dict[str, Task] = field(default_factory=dict)
    scorers: dict[str, Callable[[str, Any], Verdict]] = field(default_factory=dict)
    tokenizer: Any = None

    def get(self, name: str) -> tuple[Task, Callable[[str, Any], Verdict]]:
        if name not in self.tasks:
            from esreason import tasks

            task = tasks.get(name)
            self.tasks[name] = task
            self.scorers[name] = task.scorer(tokenizer=self.tokenizer)
        return self.tasks[name], self.scorers[name]
