"""Population coverage diagnostics during ES (paper §RQ1, Lemmas 2-3, Proposition 1).

The paper's theory (Section "Theoretically, How ES Population Diversity Can Support
Pass@K" and Appendix "Proofs for the RQ1 Diversity--Coverage Analysis") is stated in
terms of the members' success probabilities ``p_i(x) = Pr_{Y~pi_i(.|x)}[v(x, Y) = 1]``
under the correctness verifier v in {0, 1} (not the format-shaped training reward).
This module measures them during training and turns them into the quantities of the
lemmas. Every definition and estimator is documented in ``docs/coverage.md``.

Two parts:

- **Statistics** (pure numpy; the last axis of ``p`` is the member axis N, any leading
  axes are prompts): :func:`js_succ`, :func:`p_pop`, :func:`p_same`, the local links of
  the appendix proofs (:func:`js_succ_local`, :func:`gap_local`, :func:`oracle_gate`),
  the Lemma 3 comparator (:func:`selection_weights`, :func:`selection_gain`), and the
  Proposition 1 check (:func:`transfer_check`), plus the finite-sample helpers
  (:func:`between_variance`, :func:`permutation_null`).
- **Measurement pass** (:class:`CoverageProbe`): after the population of update t has
  been evaluated and before the update, every member is perturbed again (same seed and
  sign), samples ``coverage.samples`` responses per prompt for the first
  ``coverage.prompts`` prompts of the update's mini-batch, and the centre is restored
  bit-exactly; the centre itself is sampled with the matched budget N * samples.
  After the update, :meth:`CoverageProbe.finish` samples the updated centre theta+ the
  same way (read-only). All sampling seeds come from a dedicated stream of
  (train.seed, t), so the pass never touches the training randomness and the update is
  bit-identical to a run with coverage off (tests/test_coverage.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from esreason.backends.base import SamplingParams
from esreason.errors import UserError

COVERAGE_STREAM = 0xC0FE  # domain separator of the diagnostic sampling seeds
PROP1_KS: tuple[int, ...] = (1, 4, 16)
"""Repeated-sampling budgets K at which Proposition 1 is checked."""
SELECTION_LAMBDA = 1.0
"""Temperature-free softmax over the update weights z_i: w_i = exp(z_i) / sum_j exp(z_j)."""
ORACLE_LAMBDA = 1.0
"""lambda of the oracle gate softmax(lambda * p_i) (Appendix eq. rq1-oracle-gate)."""
NULL_PERMUTATIONS = 200
"""Label permutations of the finite-sample null (members made exchangeable)."""
_CENTRE = -1  # sampling-seed slot shared by the centre theta and theta+ (common random numbers)


# =========================================================================== statistics


def _as_p(p: Any, name: str = "p") -> np.ndarray:
    arr = np.asarray(p, dtype=np.float64)
    if arr.ndim < 1 or arr.shape[-1] < 1:
        raise UserError(f"{name} must have a member axis of length >= 1 (shape {arr.shape})")
    if np.any(~np.isfinite(arr)) or np.any(arr < 0) or np.any(arr > 1):
        raise UserError(f"{name} must hold probabilities in [0, 1]")
    return arr


def binary_entropy(p: Any) -> np.ndarray:
    """h(p) = -p log p - (1-p) log(1-p) in nats, with 0 log 0 = 0 (elementwise)."""
    p = np.asarray(p, dtype=np.float64)
    q = 1.0 - p
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(p > 0, -p * np.log(np.where(p > 0, p, 1.0)), 0.0)
        b = np.where(q > 0, -q * np.log(np.where(q > 0, q, 1.0)), 0.0)
    return a + b


def js_succ(p: Any) -> np.ndarray:
    """JS_succ_N(x) = h(p_bar) - (1/N) sum_i h(p_i) (Lemma 2), nats; p: [..., N] -> [...]."""
    p = _as_p(p)
    return np.maximum(binary_entropy(p.mean(-1)) - binary_entropy(p).mean(-1), 0.0)


def p_pop(p: Any) -> np.ndarray:
    """P_pop_N(x) = 1 - prod_i (1 - p_i): one response per member, any correct (eq. rq1-population-coverage-bound)."""
    p = _as_p(p)
    return 1.0 - np.prod(1.0 - p, axis=-1)


def p_same(p: Any) -> np.ndarray:
    """P_same_N(x) = 1 - (1 - p_bar)^N: the matched single-policy baseline (same equation)."""
    p = _as_p(p)
    return 1.0 - (1.0 - p.mean(-1)) ** p.shape[-1]


def js_succ_local(p: Any) -> np.ndarray:
    """Second-order form of JS_succ (Appendix eq. app-success-js-variance):
    sum_i xi_i^2 / (2 N p_bar (1 - p_bar)), xi_i = p_i - p_bar; 0 when all p_i are equal."""
    p = _as_p(p)
    pbar = p.mean(-1)
    ss = ((p - pbar[..., None]) ** 2).sum(-1)
    denom = 2.0 * p.shape[-1] * pbar * (1.0 - pbar)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ss > 0, ss / np.where(denom > 0, denom, np.nan), 0.0)


def gap_local(p: Any) -> np.ndarray:
    """Local coverage-JS link (eq. rq1-coverage-js-link): N p_bar (1-p_bar)^(N-1) JS_succ_N.

    Approximates P_pop - P_same up to O(||xi||^3)."""
    p = _as_p(p)
    n, pbar = p.shape[-1], p.mean(-1)
    return n * pbar * (1.0 - pbar) ** (n - 1) * js_succ(p)


def selection_weights(u: Any, lam: float = SELECTION_LAMBDA) -> np.ndarray:
    """Normalised weights of Lemma 3 from the update weights u_i: softmax(lam * u), [N].

    A monotone transformation of realised fitness (u_i = z_i for z-score shaping), w_i >= 0,
    sum_i w_i = 1; equal fitness gives uniform weights."""
    u = np.asarray(u, dtype=np.float64)
    if u.ndim != 1 or len(u) < 1 or not np.all(np.isfinite(u)):
        raise UserError(f"update weights must be a finite 1-d array (shape {u.shape})")
    a = lam * u
    e = np.exp(a - a.max())
    return e / e.sum()


def selection_gain(w: Any, p: Any) -> np.ndarray:
    """p_w(x) - p_bar(x) = sum_i w_i p_i - p_bar (Lemma 3); w: [N], p: [..., N] -> [...]."""
    p = _as_p(p)
    w = np.asarray(w, dtype=np.float64)
    if w.shape != p.shape[-1:]:
        raise UserError(f"weights have shape {w.shape}, expected ({p.shape[-1]},) members")
    return p @ w - p.mean(-1)


def member_cov(u: Any, p: Any) -> np.ndarray:
    """Cov_i(u_i, p_i(x)) under a uniform member draw (ddof 0); u: [N], p: [..., N] -> [...].

    Lemma 3: N * member_cov(w, p) == selection_gain(w, p) for weights summing to one."""
    p = _as_p(p)
    u = np.asarray(u, dtype=np.float64)
    if u.shape != p.shape[-1:]:
        raise UserError(f"weights have shape {u.shape}, expected ({p.shape[-1]},) members")
    return ((p - p.mean(-1, keepdims=True)) * (u - u.mean())).mean(-1)


def oracle_gate(p: Any, lam: float = ORACLE_LAMBDA) -> tuple[np.ndarray, np.ndarray]:
    """The prompt-adaptive oracle gate of Appendix eq. rq1-oracle-gate.

    Returns (gain, local): gain = sum_i softmax(lam p)_i p_i - p_bar, and its local form
    2 lam p_bar (1 - p_bar) JS_succ (eq. rq1-selection-js-link); both [...]."""
    p = _as_p(p)
    a = lam * p
    e = np.exp(a - a.max(-1, keepdims=True))
    w = e / e.sum(-1, keepdims=True)
    pbar = p.mean(-1)
    return (w * p).sum(-1) - pbar, 2.0 * lam * pbar * (1.0 - pbar) * js_succ(p)


def bernoulli_kl(p: Any, q: Any) -> np.ndarray:
    """KL(Bernoulli(p) || Bernoulli(q)) in nats (0 log 0 = 0; inf when q hits 0 or 1 and p does not)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(p > 0, p * (np.log(np.where(p > 0, p, 1.0)) - np.log(q)), 0.0)
        b = np.where(p < 1, (1 - p) * (np.log(np.where(p < 1, 1 - p, 1.0)) - np.log(1 - q)), 0.0)
    return np.maximum(a + b, 0.0)


def pass_k(p: Any, k: int) -> np.ndarray:
    """f_K(p) = 1 - (1 - p)^K, the K-sample success map of Proposition 1."""
    return 1.0 - (1.0 - np.asarray(p, dtype=np.float64)) ** int(k)


def kt_smooth(p: Any, n: int) -> np.ndarray:
    """Krichevsky-Trofimov smoothing of a rate estimated from ``n`` samples: (n p + 1/2) / (n + 1).

    Never exactly 0 or 1, so KL(B_w || B_theta+) stays finite on finite samples; two equal
    rates stay equal (KL 0)."""
    return (n * np.asarray(p, dtype=np.float64) + 0.5) / (n + 1.0)


def transfer_check(p_w: Any, p_centre: Any, p_updated: Any, ks: Sequence[int] = PROP1_KS,
                   smooth_n: int | None = None) -> dict[str, float]:
    """Proposition 1's testable condition on prompts x (all arguments [X]).

    p_w: success of the comparator pi_w; p_centre / p_updated: of pi_theta / pi_theta+.
    smooth_n: when given, p_w and p_updated enter the KL through :func:`kt_smooth` with this
    sample count (the J_K values use the plain rates).
    eps_succ = E_x KL(B_w(x) || B_theta+(x)) (eq. rq1-binary-transfer); per K:
    margin m_K = J_K(pi_w) - J_K(pi_theta), slack K sqrt(eps/2), condition m_K > slack
    (eq. rq1-positive-transfer-margin), bound = J_K(pi_w) - slack <= J_K(pi_theta+)
    (eq. rq1-center-transfer-bound), bound_x = J_K(pi_w) - K E_x sqrt(D_x/2) (the
    tighter intermediate step of the proof)."""
    arrs = [np.asarray(a, dtype=np.float64) for a in (p_w, p_centre, p_updated)]
    if len({a.shape for a in arrs}) != 1 or arrs[0].ndim != 1:
        raise UserError("transfer_check needs three 1-d arrays of the same length (one value per prompt)")
    pw, pc, pu = arrs
    if smooth_n is None:
        d_x = bernoulli_kl(pw, pu)  # [X]
    else:
        d_x = bernoulli_kl(kt_smooth(pw, smooth_n), kt_smooth(pu, smooth_n))
    eps = float(d_x.mean())
    out: dict[str, float] = {"prop1/eps_succ": eps, "prop1/p_w": float(pw.mean())}
    for k in ks:
        if int(k) < 1:
            raise UserError(f"K must be >= 1 (got {k})")
        jw, jc, ju = (float(pass_k(a, k).mean()) for a in (pw, pc, pu))
        slack = k * float(np.sqrt(eps / 2.0))
        margin = jw - jc
        out.update({f"prop1/K{k}/J_w": jw, f"prop1/K{k}/J_centre": jc, f"prop1/K{k}/J_updated": ju,
                    f"prop1/K{k}/margin": margin, f"prop1/K{k}/slack": slack,
                    f"prop1/K{k}/condition": float(margin > slack), f"prop1/K{k}/bound": jw - slack,
                    f"prop1/K{k}/bound_x": jw - k * float(np.sqrt(d_x / 2.0).mean()),
                    f"prop1/K{k}/gain": ju - jc})
    return out


def between_variance(correct: Any) -> np.ndarray:
    """Unbiased between-member variance (1/N) sum_i (p_i - p_bar)^2 from outcomes [..., N, S].

    With p_hat_i = c_i / S: E[(1/N) sum (p_hat_i - mean p_hat)^2] = V + (1 - 1/N) mean_i
    p_i (1-p_i) / S, and p_hat (1 - p_hat) / (S - 1) is unbiased for p (1-p) / S. Needs S >= 2
    (NaN otherwise). Can be negative (it is unbiased, not clipped)."""
    o = np.asarray(correct, dtype=np.float64)
    n, s = o.shape[-2], o.shape[-1]
    ph = o.mean(-1)  # [..., N]
    raw = ((ph - ph.mean(-1, keepdims=True)) ** 2).mean(-1)
    if s < 2:
        return np.full(raw.shape, np.nan)
    return raw - (1.0 - 1.0 / n) * (ph * (1.0 - ph) / (s - 1)).mean(-1)


def permutation_null(correct: Any, rng: np.random.Generator,
                     permutations: int = NULL_PERMUTATIONS) -> dict[str, np.ndarray]:
    """Null means of the plug-in JS_succ and P_pop - P_same when members are exchangeable.

    correct: [X, N, S] outcomes. Per prompt, the N*S outcomes are pooled and re-dealt to the
    members at random ``permutations`` times; the mean of each statistic over the re-deals
    is what finite sampling alone produces (the plug-in floor, about (1 - 1/N) / (2S) nats
    for JS_succ). Returns {'js_succ': [X], 'gap': [X]}."""
    o = np.asarray(correct, dtype=bool)
    x, n, s = o.shape
    flat = np.broadcast_to(o.reshape(x, 1, n * s), (x, permutations, n * s))
    dealt = rng.permuted(flat, axis=-1).reshape(x, permutations, n, s)  # [X, R, N, S]
    ph = dealt.mean(-1)  # [X, R, N]
    return {"js_succ": js_succ(ph).mean(-1), "gap": (p_pop(ph) - p_same(ph)).mean(-1)}


# =========================================================================== measurement


def coverage_seed(train_seed: int, step: int, slot: int) -> int:
    """Sampling seed of one diagnostic generate call (member index, or the centre's slot)."""
    ss = np.random.SeedSequence([int(train_seed), COVERAGE_STREAM, int(step), int(slot) % 2**32])
    return int(ss.generate_state(1, dtype=np.uint32)[0] & 0x7FFFFFFF)


def sample_correct(generator: Any, scorer: Callable[[str, Any], Any], prompts: Sequence[str],
                   golds: Sequence[Any], samples: int, params: SamplingParams) -> tuple[np.ndarray, int]:
    """``samples`` responses per prompt in one generate call; verifier-correct flags [X, S] and tokens."""
    rows = [p for p in prompts for _ in range(samples)]
    gen = generator.generate(rows, params)
    flags = np.array([bool(scorer(text, golds[r // samples]).correct) for r, text in enumerate(gen.texts)],
                     dtype=bool)
    return flags.reshape(len(prompts), samples), gen.num_tokens


@dataclass
class CoverageSample:
    """Outcomes of the pass before the update.

    members: [X, N, S] correct flags, member i's s-th response to prompt x.
    centre: [X, N*S] correct flags at the centre theta.
    offset_weights: [N] u_i, the coefficient of member i's offset in the update
        (theta+ - theta = alpha / (N sigma) sum_i u_i Delta_i, u_i = z_i).
    """

    members: np.ndarray
    centre: np.ndarray
    offset_weights: np.ndarray
    tokens: int
    seconds: float


class CoverageProbe:
    """The measurement pass of one update (see the module docstring; docs/coverage.md).

    policy: the trainer's PerturbablePolicy (``perturb``/``restore``); generator: the
    trainer's generator on the same model; scorer: the task verifier. Use
    :meth:`measure` before the update and :meth:`finish` after it.
    """

    def __init__(self, cfg: Any, policy: Any, generator: Any, scorer: Callable[[str, Any], Any],
                 step: int) -> None:
        self.cov = cfg.coverage
        self.gen_cfg = cfg.generation
        self.train_seed = cfg.train.seed
        self.policy = policy
        self.generator = generator
        self.scorer = scorer
        self.step = int(step)
        self._pending: tuple[CoverageSample, list[str], list[Any]] | None = None

    def _params(self, slot: int) -> SamplingParams:
        return SamplingParams(max_new_tokens=self.gen_cfg.max_new_tokens, temperature=self.cov.temperature,
                              top_p=self.gen_cfg.top_p, seed=coverage_seed(self.train_seed, self.step, slot))

    def measure(self, population: Any, sigma: float, prompts: Sequence[str], golds: Sequence[Any],
                weights: Sequence[float]) -> CoverageSample:
        """Sample every member and the centre; the centre is restored after each member."""
        t0 = time.perf_counter()
        timings = getattr(getattr(self.policy, "params", None), "timings", None)
        saved = dict(timings) if timings is not None else None
        x = min(self.cov.prompts, len(prompts))
        ps, gs = list(prompts[:x]), list(golds[:x])
        s, n = self.cov.samples, len(population)
        if len(weights) != n:
            raise UserError(f"{len(weights)} update weights for a population of {n}")
        members = np.zeros((x, n, s), dtype=bool)
        tokens = 0
        for i, (seed, sign) in enumerate(zip(population.seeds, population.signs)):
            self.policy.perturb(seed, sign * sigma)
            try:
                members[:, i, :], tok = sample_correct(self.generator, self.scorer, ps, gs, s, self._params(i))
            finally:
                self.policy.restore()
            tokens += tok
        centre, tok = sample_correct(self.generator, self.scorer, ps, gs, n * s, self._params(_CENTRE))
        if saved is not None:  # keep time/perturb and time/restore about training only
            timings.clear()
            timings.update(saved)
        # u_i = (z_i sign_i) * sign_i = z_i: the member's own offset sign_i sigma eps_i gets weight z_i.
        u = np.asarray(weights, dtype=np.float64) * np.asarray(population.signs, dtype=np.float64)
        sample = CoverageSample(members, centre, u, tokens + tok, time.perf_counter() - t0)
        self._pending = (sample, ps, gs)
        return sample

    def finish(self) -> dict[str, float]:
        """Sample the updated centre theta+ (common seed with the theta sample) and return the
        ``coverage/...`` metrics of this update."""
        if self._pending is None:
            raise RuntimeError("finish() called before measure()")
        sample, ps, gs = self._pending
        self._pending = None
        t0 = time.perf_counter()
        m = sample.centre.shape[1]
        updated, tok = sample_correct(self.generator, self.scorer, ps, gs, m, self._params(_CENTRE))
        metrics = coverage_metrics(sample.members, sample.centre, updated, sample.offset_weights,
                                   np.random.Generator(np.random.PCG64(np.random.SeedSequence(
                                       [self.train_seed, COVERAGE_STREAM, self.step, 2**31]))))
        metrics["time"] = sample.seconds + time.perf_counter() - t0
        metrics["tokens"] = float(sample.tokens + tok)
        return {f"coverage/{k}": v for k, v in metrics.items()}


def coverage_metrics(members: np.ndarray, centre: np.ndarray, updated: np.ndarray, u: np.ndarray,
                     rng: np.random.Generator, ks: Sequence[int] = PROP1_KS) -> dict[str, float]:
    """All per-update statistics from the outcome arrays (averaged over the X prompts).

    members: [X, N, S]; centre, updated: [X, M] correct flags; u: [N] update weights z_i.
    Keys are documented in docs/coverage.md (without the ``coverage/`` prefix)."""
    members = np.asarray(members, dtype=bool)
    x, n, s = members.shape
    ph = members.mean(-1)  # [X, N] p_hat_i(x)
    pc = np.asarray(centre, dtype=np.float64).mean(-1)  # [X]
    pu = np.asarray(updated, dtype=np.float64).mean(-1)  # [X]
    null = permutation_null(members, rng)
    js = js_succ(ph)
    gap = p_pop(ph) - p_same(ph)
    w = selection_weights(u)
    og, og_local = oracle_gate(ph)
    pi_mean = ph.mean(0)  # [N] member success averaged over prompts
    corr = (float(np.corrcoef(u, pi_mean)[0, 1])
            if n > 1 and np.std(u) > 0 and np.std(pi_mean) > 0 else float("nan"))
    out: dict[str, float] = {
        "prompts": float(x), "samples": float(s),
        "p_bar": float(ph.mean()), "p_centre": float(pc.mean()), "p_updated": float(pu.mean()),
        "P_pop": float(p_pop(ph).mean()), "P_same": float(p_same(ph).mean()), "gap": float(gap.mean()),
        "gap_null": float(null["gap"].mean()), "gap_local": float(gap_local(ph).mean()),
        "JS_succ": float(js.mean()), "JS_succ_null": float(null["js_succ"].mean()),
        "JS_succ_excess": float((js - null["js_succ"]).mean()),
        "JS_succ_local": float(js_succ_local(ph).mean()),
        "var_between": float(np.nanmean(between_variance(members))) if s > 1 else float("nan"),
        "cov_wp": float(member_cov(u, ph).mean()), "corr_wp": corr,
        "selection_gain": float(selection_gain(w, ph).mean()),
        "oracle_gain": float(og.mean()), "oracle_gain_local": float(og_local.mean()),
    }
    p_w = ph @ w  # [X]
    out.update(transfer_check(p_w, pc, pu, ks, smooth_n=np.asarray(updated).shape[-1]))
    return out
