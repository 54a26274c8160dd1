"""Coverage of the report's intervals, by simulation at the demo's shape.

``python -m esreason.report.coverage`` prints the table of docs/report.md ("Coverage");
tests/test_intervals.py runs the shipped intervals through it.

The simulated evaluation (:class:`Shape`; defaults: the demo) has T tasks x n problems x M
samples per problem. Problem p of task t has a logit difficulty ``d_p ~ N(mu_t, tau^2)`` (base
Pass@1 near 0.65 / 0.25 / 0.33, as demo-add / demo-sub / demo-sub3). A trained method m with
training seed s solves it with probability

    expit(d_p + delta_m + eta_mp + alpha_ms + gamma_msp)

with a method shift ``delta_m``, a per-problem method effect ``eta_mp ~ N(0, sd_eta^2)`` (the
same for every seed: what the method learns about that problem), a seed effect
``alpha_ms ~ N(0, sd_alpha^2)`` and a seed x problem interaction ``gamma_msp ~ N(0,
sd_gamma^2)``; Base (no training seed) uses ``d_p`` alone. Each of the M samples is correct
with that probability; the per-problem score is Pass@1 = correct / M. ``sd_alpha`` is set so
that a seed moves the task-averaged Pass@1 by ``seed_sd_pp`` percentage points (one sd).

The truth is exact: every logit is a sum of independent normals, so a method's population
Pass@1 on task t is ``E[expit(N(mu_t + delta_m, tau^2 + sd_eta^2 + sd_alpha^2 + sd_gamma^2))]``
(Gauss–Hermite, 80 nodes); a single seed's own truth fixes ``alpha_ms`` instead of integrating
it. Two comparisons: a trained method against Base (``"base"``) and two independently trained
methods (``"independent"``: ES vs GRPO).

Each simulated interval also records whether its ANOVA seed estimate was <= 0 ("truncated": the
usual rule would then set the seed term to 0 and drop its df; :mod:`esreason.report.components`), so the
table shows the coverage of those intervals (:class:`CoverageCell`) beside the overall one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from esreason.report.components import moments
from esreason.report.exact import exact_distribution
from esreason.report.resample import cdf_knots, knots_interval
from esreason.report.tdist import t_quantile

_GH_X, _GH_W = np.polynomial.hermite_e.hermegauss(80)  # probabilists' Hermite: weight exp(-x^2/2)
_GH_W = _GH_W / _GH_W.sum()


def _expit(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def mean_expit(mu: float, var: float) -> float:
    """E[expit(Z)] for Z ~ N(mu, var) (Gauss–Hermite)."""
    return float(np.sum(_GH_W * _expit(mu + math.sqrt(var) * _GH_X)))


@lru_cache(maxsize=64)
def _mu(tau: float, target: float) -> float:
    """The logit location whose population Pass@1 under difficulty sd ``tau`` is ``target`` (bisection)."""
    lo, hi = -10.0, 10.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if mean_expit(mid, tau ** 2) < target else (lo, mid)
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Shape:
    """The simulated evaluation and effects (logit scale unless named in pp)."""

    tasks: int = 3
    problems: int = 256
    samples: int = 32
    base_pass1: tuple[float, ...] = (0.65, 0.25, 0.33)
    tau: float = 2.0
    delta: dict[str, float] = field(default_factory=lambda: {"a": 0.10, "b": 0.20})
    sd_eta: float = 0.30
    sd_gamma: float = 0.20

    def mu(self, t: int) -> float:
        """Logit location of task t whose population base Pass@1 is ``base_pass1[t]``."""
        return _mu(self.tau, self.base_pass1[t % len(self.base_pass1)])

    def sd_alpha(self, seed_sd_pp: float) -> float:
        """Logit seed sd that moves the task-averaged Pass@1 by ``seed_sd_pp`` pp (mean slope p(1-p))."""
        if seed_sd_pp == 0:
            return 0.0
        v = self.tau ** 2 + self.sd_eta ** 2 + self.sd_gamma ** 2
        slope = np.mean([float(np.sum(_GH_W * (p := _expit(self.mu(t) + math.sqrt(v) * _GH_X)) * (1 - p)))
                         for t in range(self.tasks)])
        return seed_sd_pp / 100 / slope

    def truth(self, method: str, sd_alpha: float, alpha: np.ndarray | None = None) -> np.ndarray:
        """Population Pass@1 averaged over tasks: a scalar, or per given seed effects ``alpha [...]``."""
        if method == "base":
            return np.asarray(np.mean([mean_expit(self.mu(t), self.tau ** 2) for t in range(self.tasks)]))
        v_fixed = self.tau ** 2 + self.sd_eta ** 2 + self.sd_gamma ** 2
        if alpha is None:
            return np.asarray(np.mean([mean_expit(self.mu(t) + self.delta[method], v_fixed + sd_alpha ** 2)
                                       for t in range(self.tasks)]))
        out = np.zeros(np.shape(alpha))
        for t in range(self.tasks):
            z = self.mu(t) + self.delta[method] + np.asarray(alpha)[..., None] + math.sqrt(v_fixed) * _GH_X
            out += (_expit(z) * _GH_W).sum(-1)
        return out / self.tasks


@dataclass
class Experiments:
    """E simulated experiments: per-task Pass@1 tables and the seed effects behind them."""

    tables: dict[str, dict[str, np.ndarray]]  # method -> {task: [E, S, n]} (base: [E, 1, n])
    alpha: dict[str, np.ndarray]  # method -> [E, S] seed effects (logit)


def simulate(shape: Shape, experiments: int, seeds: int, seed_sd_pp: float, rng: np.random.Generator,
             methods: tuple[str, ...] = ("a", "b"), base: bool = True) -> Experiments:
    """Draw ``experiments`` independent evaluations of the trained ``methods`` (``seeds`` each) and,
    when ``base``, of Base, on the same problems."""
    e, n, s = experiments, shape.problems, seeds
    sd_a = shape.sd_alpha(seed_sd_pp)
    alpha = {m: rng.normal(0.0, sd_a, size=(e, s)) for m in methods}
    tables: dict[str, dict[str, np.ndarray]] = {m: {} for m in (("base",) if base else ()) + methods}
    for t in range(shape.tasks):
        d = rng.normal(shape.mu(t), shape.tau, size=(e, 1, n))
        if base:
            tables["base"][str(t)] = rng.binomial(shape.samples, _expit(d)) / shape.samples
        for m in methods:
            eta = rng.normal(0.0, shape.sd_eta, size=(e, 1, n))
            gamma = rng.normal(0.0, shape.sd_gamma, size=(e, s, n))
            logit = d + shape.delta[m] + eta + alpha[m][:, :, None] + gamma
            tables[m][str(t)] = rng.binomial(shape.samples, _expit(logit)) / shape.samples
    return Experiments(tables, alpha)


@lru_cache(maxsize=8)
def _quantile_grid(q: float) -> tuple[np.ndarray, np.ndarray]:
    grid = np.geomspace(1.0, 1e6, 400)
    return grid, np.array([t_quantile(q, float(d)) for d in grid])


def t_quantiles(q: float, df: np.ndarray) -> np.ndarray:
    """:func:`esreason.report.tdist.t_quantile` for many df at once: exact on a grid of 400 df from 1
    to 1e6 (log-spaced), interpolated in log df between (error below 1e-4 relative), normal above."""
    grid, table = _quantile_grid(q)
    out = np.interp(np.log(np.clip(df, 1.0, 1e6)), np.log(grid), table)
    return np.where(np.isfinite(df) & (df < 1e6), out, t_quantile(q, math.inf))


def t_intervals(sides: list[tuple[float, dict[str, np.ndarray]]], level: float = 0.95,
                cap_df: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The shipped seed-level t-intervals (:func:`esreason.report.components.moments`) of E
    experiments: low, high and whether each one's seed estimate was truncated."""
    m = moments(sides, cap_df)
    q = t_quantiles((1 + level) / 2, np.atleast_1d(m.df))
    half = q * np.sqrt(np.maximum(m.var, 0.0))
    return m.value - half, m.value + half, np.atleast_1d(m.truncated)


def percentile_intervals(per_task: dict[str, np.ndarray], level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """The shipped one-seed interval of E experiments: the problem bootstrap's percentile interval,
    read off its exact distribution (:func:`esreason.report.exact.exact_distribution`);
    ``per_task`` holds per-problem differences [E, n]."""
    ends = []
    for e in range(next(iter(per_task.values())).shape[0]):
        atoms, mass = exact_distribution({t: x[e] for t, x in per_task.items()})  # type: ignore[misc]
        ends.append(knots_interval(cdf_knots(atoms, mass), level))
    out = np.array(ends, dtype=np.float64)
    return out[:, 0], out[:, 1]


def crossed_bootstrap(sides: list[tuple[float, dict[str, np.ndarray]]], resamples: int, rng: np.random.Generator,
                      paired: bool, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """The replaced method (the crossed two-level percentile bootstrap of Agarwal et al. 2021,
    kept for comparison): seeds and problems resampled, seed draws shared when ``paired``."""
    tasks = list(sides[0][1])
    n_seeds = [next(iter(tab.values())).shape[-2] for _, tab in sides]
    w_shared = rng.multinomial(max(n_seeds), np.full(max(n_seeds), 1.0 / max(n_seeds)), size=resamples)
    ws = [np.ones((resamples, 1)) if s == 1 else
          (w_shared if paired else rng.multinomial(s, np.full(s, 1.0 / s), size=resamples)).astype(np.float64)
          for s in n_seeds]
    total = 0.0
    for t in tasks:
        n = sides[0][1][t].shape[-1]
        v = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(np.float64)  # [R, n]
        for (sign, tab), w in zip(sides, ws):
            x = tab[t]  # [E, S, n]
            xv = np.einsum("esn,rn->ers", x, v) / n  # [E, R, S]
            total = total + sign * (xv * w[None]).sum(-1) / w.sum(-1)[None]
    reps = total / len(tasks)  # [E, R]
    lo, hi = np.quantile(reps, [(1 - level) / 2, (1 + level) / 2], axis=1)
    return lo, hi


@dataclass(frozen=True)
class CoverageCell:
    """One cell of the coverage table: per simulated experiment, whether its interval covered the
    truth, whether its ANOVA seed estimate was truncated (<= 0) and whether its seed term is the
    detection floor (:mod:`esreason.report.components`; both always False at S = 1)."""

    covered: np.ndarray
    truncated: np.ndarray
    floored: np.ndarray

    @property
    def coverage(self) -> float:
        """Fraction of intervals that cover the truth."""
        return float(self.covered.mean())

    @property
    def truncated_share(self) -> float:
        """Fraction of intervals whose seed estimate was truncated."""
        return float(self.truncated.mean())

    @property
    def floored_share(self) -> float:
        """Fraction of intervals whose seed term is the detection floor."""
        return float(self.floored.mean())

    @property
    def truncated_count(self) -> int:
        """Number of intervals whose seed estimate was truncated."""
        return int(self.truncated.sum())

    @property
    def truncated_coverage(self) -> float:
        """Coverage among the truncated intervals (NaN when there are none)."""
        return float(self.covered[self.truncated].mean()) if self.truncated.any() else math.nan


def _chunk(shape: Shape, comparison: str, seeds: int, seed_sd_pp: float, experiments: int, method: str,
           rng: np.random.Generator, resamples: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(covered, truncated, floored) of ``experiments`` simulated experiments (:func:`coverage_cell`)."""
    methods = ("a",) if comparison == "base" else ("a", "b")
    sim = simulate(shape, experiments, seeds, seed_sd_pp, rng, methods, base=comparison == "base")
    other = "base" if comparison == "base" else "b"
    sd_a = shape.sd_alpha(seed_sd_pp)
    sides = [(1.0, sim.tables["a"]), (-1.0, sim.tables[other])]
    truncated = floored = np.zeros(experiments, dtype=bool)
    if seeds == 1 and method == "shipped":
        truth = shape.truth("a", sd_a, sim.alpha["a"][:, 0]) - (
            shape.truth("base", 0.0) if other == "base" else shape.truth("b", sd_a, sim.alpha["b"][:, 0]))
        diffs = {t: sim.tables["a"][t][:, 0] - sim.tables[other][t][:, 0] for t in sim.tables["a"]}
        lo, hi = percentile_intervals(diffs)
    else:
        truth = shape.truth("a", sd_a) - shape.truth(other, sd_a)
        if seeds > 1:
            m = moments(sides)
            truncated, floored = np.atleast_1d(m.truncated), np.atleast_1d(m.floored)
        if method == "shipped":
            lo, hi, _ = t_intervals(sides)
        elif method == "satterthwaite":
            lo, hi, _ = t_intervals(sides, cap_df=False)
        elif method in ("crossed_paired", "crossed_unpaired"):
            lo, hi = crossed_bootstrap(sides, resamples, rng, paired=method == "crossed_paired")
        elif method == "t_seeds":
            per_seed = sum(sign * np.mean([tab[t].mean(-1) for t in tab], axis=0) for sign, tab in sides)  # [E, S]
            se = per_seed.std(-1, ddof=1) / math.sqrt(seeds)
            q = t_quantile(0.975, seeds - 1)
            lo, hi = per_seed.mean(-1) - q * se, per_seed.mean(-1) + q * se
        else:
            raise ValueError(f"unknown method {method!r}")
    return (lo <= truth) & (truth <= hi), truncated, floored


def coverage_cell(shape: Shape, comparison: str, seeds: int, seed_sd_pp: float, experiments: int = 400,
                  method: str = "shipped", rng_seed: int = 0, resamples: int = 1000,
                  chunk: int = 1000) -> CoverageCell:
    """Simulate ``experiments`` experiments, ``chunk`` at a time (memory), and score each one's 95 %
    interval against the truth.

    comparison: ``"base"`` (method a - Base) or ``"independent"`` (a - b, independent seeds).
    method: ``"shipped"`` (t-interval for seeds > 1; the problem bootstrap of one seed, exact, scored
    against that seed's own truth), ``"satterthwaite"`` (the shipped interval without the df cap),
    ``"crossed_paired"`` / ``"crossed_unpaired"`` (the replaced crossed bootstrap, seeds paired by
    index or not; scored against the population truth), or ``"t_seeds"`` (a plain t-interval over
    the S per-seed differences, reference). The first chunk's random stream is the one every
    earlier version of this simulator used, so a cell of at most ``chunk`` experiments is unchanged.
    """
    if comparison not in ("base", "independent"):
        raise ValueError(f"comparison must be 'base' or 'independent', got {comparison!r}")
    parts = []
    for i, start in enumerate(range(0, experiments, chunk)):
        key = [rng_seed, seeds, int(seed_sd_pp * 1000), comparison == "base"] + ([i] if i else [])
        parts.append(_chunk(shape, comparison, seeds, seed_sd_pp, min(chunk, experiments - start), method,
                            np.random.default_rng(key), resamples))
    return CoverageCell(*(np.concatenate(p) for p in zip(*parts)))


def coverage(shape: Shape, comparison: str, seeds: int, seed_sd_pp: float, experiments: int = 400,
             method: str = "shipped", rng_seed: int = 0, resamples: int = 1000) -> float:
    """Fraction of ``experiments`` whose 95 % interval covers the truth (:func:`coverage_cell`)."""
    return coverage_cell(shape, comparison, seeds, seed_sd_pp, experiments, method, rng_seed, resamples).coverage


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - prints the docs table
    import argparse

    parser = argparse.ArgumentParser(description="Coverage table of docs/report.md (Intervals).")
    parser.add_argument("--experiments", type=int, default=4000,
                        help="experiments per cell for the shipped interval and its truncated subset")
    parser.add_argument("--replaced-experiments", type=int, default=1000,
                        help="experiments per cell for the replaced / reference intervals (0: leave them out)")
    args = parser.parse_args(argv)
    shape = Shape()
    print("| S | seed sd (pp) | comparison | shipped (this code) | truncated share | shipped when truncated (n)"
          " | floored share | crossed bootstrap, paired by index (replaced) | crossed, unpaired"
          " | t over per-seed differences |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for s in (1, 3, 5):
        for sd in (0.0, 1.0, 2.0):
            for comp in ("independent", "base"):
                cell = coverage_cell(shape, comp, s, sd, args.experiments)
                cells = [f"{cell.coverage:.3f}"]
                if s > 1:
                    when = f"{cell.truncated_coverage:.3f} ({cell.truncated_count})" if cell.truncated_count else "–"
                    cells += [f"{cell.truncated_share:.3f}", when, f"{cell.floored_share:.3f}"]
                    if args.replaced_experiments:
                        cells += [f"{coverage(shape, comp, s, sd, args.replaced_experiments, m):.3f}"
                                  for m in ("crossed_paired", "crossed_unpaired", "t_seeds")]
                cells += ["–"] * (7 - len(cells))
                print(f"| {s} | {sd:g} | {comp} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":  # pragma: no cover
    main()
