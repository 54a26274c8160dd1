"""``esreason analyze coverage`` and ``esreason analyze lemma1`` (paper §RQ1 theory; docs/coverage.md).

- ``coverage RUN``: reads ``RUN/metrics.jsonl``, keeps the updates that logged the
  ``coverage/...`` diagnostics of :mod:`esreason.es_loop.coverage`, and writes a table
  (``coverage.md/.tex/.json``) and two figures: diversity (P_pop vs P_same, JS_succ
  against its finite-sample null and its local form, Cov(w, p)) and Proposition 1 (the
  margin m_K against K sqrt(eps/2), and the bound on J_K(pi_theta+)).
- ``lemma1``: a numerical check of Lemma 1 on a model (default: the embedded demo):
  the population's policy JS divergence JS_pol_N(x) against the small-sigma law
  (sigma^2 / 2)(1 - 1/N) tr I_x(theta), over a sigma grid, written as a table and a
  log-log plot. The estimators are in :func:`policy_js` and :func:`fisher_trace`.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from esreason.analysis.tables import Table, fmt, fmt_sci
from esreason.errors import UserError

PREFIX = "coverage/"
_TABLE_COLUMNS = [("p_bar", "p_bar"), ("p_centre", "p_θ"), ("P_pop", "P_pop"), ("P_same", "P_same"),
                  ("gap", "gap"), ("gap_null", "gap null"), ("JS_succ", "JS_succ"),
                  ("JS_succ_null", "JS_succ null"), ("JS_succ_local", "JS_succ local"),
                  ("cov_wp", "Cov(z,p)"), ("selection_gain", "p_w − p_bar")]


# =========================================================================== analyze coverage RUN


def load_coverage_rows(run: str | Path) -> list[dict[str, Any]]:
    """Rows of ``RUN/metrics.jsonl`` that hold coverage metrics: {'step': t, key: value} with
    the ``coverage/`` prefix removed. UserError when the run or its metrics are missing."""
    from esreason.io.metrics import read_metrics

    path = Path(run)
    metrics = path / "metrics.jsonl" if path.is_dir() else path
    if not metrics.is_file():
        raise UserError(f"no metrics file at {metrics} (expected a run directory with metrics.jsonl)")
    rows = []
    for row in read_metrics(metrics):
        cov = {k[len(PREFIX):]: v for k, v in row.items() if k.startswith(PREFIX)}
        if cov:
            rows.append({"step": row["step"], **cov})
    if not rows:
        raise UserError(f"{metrics} has no coverage metrics; train with coverage.every > 0 "
                        "(e.g. --set coverage.every=5), see docs/coverage.md")
    return rows


def _ks(rows: Sequence[dict[str, Any]]) -> list[int]:
    ks = {int(k.split("/")[1][1:]) for r in rows for k in r if k.startswith("prop1/K") and k.endswith("/margin")}
    return sorted(ks)


def _mean(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(float(r[key]))]
    return float(np.mean(vals)) if vals else None


def _cell(key: str, value: float | None) -> str:
    """Gaps can be tiny (N p_bar (1 - p_bar)^(N-1) vanishes for large N): scientific notation there."""
    return fmt_sci(value, 2) if key.startswith("gap") else fmt(value)


def coverage_report(rows: Sequence[dict[str, Any]], run: str) -> tuple[list[Table], dict[str, Any]]:
    """Tables (per update, and Proposition 1 per K) and the JSON payload of a run's coverage rows."""
    t1 = Table(f"Population coverage diagnostics of {Path(run).name}",
               ["update"] + [label for _, label in _TABLE_COLUMNS],
               caption="Success estimates use the verifier's correctness (not the format reward). "
                       "'null' = mean of the statistic when member labels are permuted (finite-sample "
                       "floor); JS in nats. Last row: mean over the logged updates.")
    for r in rows:
        t1.add(r["step"], *[_cell(k, r.get(k) if isinstance(r.get(k), (int, float)) else None)
                            for k, _ in _TABLE_COLUMNS])
    t1.add("mean", *[_cell(k, _mean(rows, k)) for k, _ in _TABLE_COLUMNS])
    ks = _ks(rows)
    t2 = Table("Proposition 1: margin m_K against K·sqrt(eps_succ/2) (means over logged updates)",
               ["K", "eps_succ", "J_K(w)", "J_K(θ)", "J_K(θ+)", "m_K", "K·sqrt(eps/2)",
                "condition held", "bound on J_K(θ+)", "bound held"],
               caption="condition held: share of updates with m_K > K sqrt(eps/2) (eq. "
                       "rq1-positive-transfer-margin); bound held: share with J_K(θ+) >= "
                       "J_K(w) - K sqrt(eps/2) (eq. rq1-center-transfer-bound), on the estimates; "
                       "w = the reward-weighted mixture pi_w of Lemma 3.")
    summary: dict[str, Any] = {}
    for k in ks:
        pre = f"prop1/K{k}/"
        held = [r[pre + "J_updated"] >= r[pre + "bound"] for r in rows if pre + "bound" in r]
        entry = {"eps_succ": _mean(rows, "prop1/eps_succ"), "J_w": _mean(rows, pre + "J_w"),
                 "J_centre": _mean(rows, pre + "J_centre"), "J_updated": _mean(rows, pre + "J_updated"),
                 "margin": _mean(rows, pre + "margin"), "slack": _mean(rows, pre + "slack"),
                 "condition_share": _mean(rows, pre + "condition"),
                 "bound": _mean(rows, pre + "bound"),
                 "bound_held_share": float(np.mean(held)) if held else None}
        summary[f"K{k}"] = entry
        t2.add(k, fmt(entry["eps_succ"]), fmt(entry["J_w"]), fmt(entry["J_centre"]), fmt(entry["J_updated"]),
               fmt(entry["margin"]), fmt(entry["slack"]), fmt(entry["condition_share"], 2), fmt(entry["bound"]),
               fmt(entry["bound_held_share"], 2))
    payload = {"run": str(run), "updates": [r["step"] for r in rows], "rows": list(rows),
               "means": {k: _mean(rows, k) for k in sorted({k for r in rows for k in r} - {"step"})},
               "prop1": summary,
               "notes": ["coverage metrics are estimates from finite samples; see docs/coverage.md"]}
    return [t1, t2], payload


def _series(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and math.isfinite(float(v)):
            xs.append(int(r["step"]))
            ys.append(float(v))
    return xs, ys


def _finish_axes(axes: Sequence[Any]) -> None:
    from matplotlib.ticker import MaxNLocator

    for a in axes:
        a.set_xlabel("update")
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
        a.grid(alpha=0.3)
        a.legend(fontsize=7)


def plot_coverage(rows: Sequence[dict[str, Any]], out: Path, title: str) -> list[Path]:
    """coverage_diversity.png (Lemmas 2-3) and coverage_prop1.png (Proposition 1)."""
    from esreason.analysis.plots import _save, plt

    def draw(ax: Any, spec: Sequence[tuple[str, str, str]]) -> None:
        for key, label, style in spec:
            ax.plot(*_series(rows, key), style, label=label, markersize=3)

    fig, axes = plt.subplots(1, 4, figsize=(19, 4))
    draw(axes[0], (("P_pop", "P_pop (one response per member)", "-o"),
                   ("P_same", "P_same (matched single policy)", "-s"),
                   ("p_bar", "p̄ (mean member success)", "--"), ("p_centre", "p_θ (centre)", ":")))
    axes[0].set_title("Lemma 2: coverage")
    axes[0].set_ylabel("success probability (mean over prompts)")
    draw(axes[1], (("JS_succ", "JS_succ (plug-in)", "-o"), ("JS_succ_null", "permutation null", "--"),
                   ("JS_succ_excess", "excess over the null", "-^"),
                   ("JS_succ_local", "local form Σξ²/(2N p̄(1−p̄))", ":")))
    axes[1].set_title("Lemma 2: success JS (nats)")
    draw(axes[2], (("gap", "P_pop − P_same", "-o"), ("gap_null", "permutation null", "--"),
                   ("gap_local", "N p̄(1−p̄)^(N−1) JS_succ", ":")))
    axes[2].set_title("Lemma 2: coverage gap")
    draw(axes[3], (("cov_wp", "Cov_i(z_i, p_i)", "-o"), ("selection_gain", "p_w − p̄ = N Cov(w, p)", "-s"),
                   ("oracle_gain", "oracle gate gain (λ=1)", "--")))
    axes[3].axhline(0.0, color="grey", linewidth=0.8)
    axes[3].set_title("Lemma 3: reward weighting")
    _finish_axes(axes)
    fig.suptitle(title)
    paths = [_save(fig, out / "coverage_diversity.png")]

    ks = _ks(rows)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for n, k in enumerate(ks):
        c = colors[n % len(colors)]
        axes[0].plot(*_series(rows, f"prop1/K{k}/margin"), "-o", color=c, markersize=3, label=f"m_{k}")
        axes[0].plot(*_series(rows, f"prop1/K{k}/slack"), "--", color=c, label=f"{k}·sqrt(ε/2)")
        axes[1].plot(*_series(rows, f"prop1/K{k}/J_updated"), "-o", color=c, markersize=3, label=f"J_{k}(π_θ+)")
        axes[1].plot(*_series(rows, f"prop1/K{k}/bound"), "--", color=c, label=f"bound J_{k}(π_w) − {k}·sqrt(ε/2)")
        axes[1].plot(*_series(rows, f"prop1/K{k}/J_centre"), ":", color=c, label=f"J_{k}(π_θ)")
    axes[0].axhline(0.0, color="grey", linewidth=0.8)
    axes[0].set_title("Proposition 1: margin m_K vs K·sqrt(ε_succ/2)")
    axes[1].set_ylim(-0.05, 1.05)
    axes[1].set_title("Proposition 1: bound on J_K(π_θ+) (bounds < 0 are vacuous, clipped)")
    _finish_axes(axes)
    fig.suptitle(title)
    paths.append(_save(fig, out / "coverage_prop1.png"))
    return paths


# =========================================================================== Lemma 1


@dataclass(frozen=True)
class Lemma1Settings:
    """What the Lemma 1 check measures (see docs/coverage.md, "Lemma 1 on the embedded default").

    population: N; prompts: first prompts of the task split; samples: responses per member
    and prompt for JS_pol; fisher_samples: responses at the centre per prompt for tr I_x;
    repeats: independent populations per sigma (the same ones for every sigma).
    """

    model: str = "demo"
    task: str = "demo-add"
    split: str = "train"
    sigmas: tuple[float, ...] = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
    population: int = 8
    prompts: int = 4
    samples: int = 16
    fisher_samples: int = 32
    repeats: int = 2
    max_new_tokens: int = 64
    temperature: float = 1.0
    dtype: str = "float32"
    seed: int = 0

    def check(self) -> None:
        for name in ("population", "prompts", "samples", "fisher_samples", "repeats", "max_new_tokens"):
            if int(getattr(self, name)) < (2 if name == "population" else 1):
                raise UserError(f"--{name.replace('_', '-')} must be >= {2 if name == 'population' else 1} "
                                f"(got {getattr(self, name)})")
        if not self.sigmas or any(not (s > 0 and math.isfinite(s)) for s in self.sigmas):
            raise UserError(f"--sigmas must be positive finite numbers (got {list(self.sigmas)})")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise UserError(f"--temperature must be > 0 (got {self.temperature})")
        if self.dtype not in ("float32", "float64"):
            raise UserError(f"--dtype must be float32 or float64 (got {self.dtype!r})")


def parse_sigmas(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise UserError(f"--sigmas must be comma-separated numbers (got {text!r})") from None
    if not vals:
        raise UserError("--sigmas is empty")
    return vals


def _with_stop(ids: Sequence[int], max_new_tokens: int, eos: int) -> list[int]:
    """The response as a token sequence of the policy: the returned ids plus the stop token when
    the sampler stopped at EOS (it returns ids without it), i.e. when fewer than max_new_tokens came back."""
    out = list(ids)
    return out + [eos] if len(out) < max_new_tokens else out


def response_logprobs(model: Any, prompt_ids: Sequence[int], responses: Sequence[Sequence[int]],
                      temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced next-token log-distributions over the responses of one prompt.

    Returns (logp [R, T, V] float64 = log softmax(logits / temperature) at the step that
    emits response token t, mask [R, T] bool); rows are right-padded (causal attention
    makes the padding invisible to earlier positions)."""
    lp, r = len(prompt_ids), len(responses)
    t_max = max(1, max(len(y) for y in responses))
    dev = next(model.parameters()).device
    inp = torch.zeros((r, lp + t_max), dtype=torch.long)
    mask = torch.zeros((r, t_max), dtype=torch.bool)
    attn = torch.zeros((r, lp + t_max), dtype=torch.long)
    for k, y in enumerate(responses):
        row = list(prompt_ids) + list(y)
        inp[k, :len(row)] = torch.tensor(row)
        attn[k, :len(row)] = 1
        mask[k, :len(y)] = True
    with torch.no_grad():
        logits = model(input_ids=inp.to(dev), attention_mask=attn.to(dev)).logits  # [R, Lp+T, V]
    step_logits = logits[:, lp - 1:lp - 1 + t_max, :].to(torch.float64) / temperature  # [R, T, V]
    return torch.log_softmax(step_logits, dim=-1).cpu(), mask


def policy_js(logps: Sequence[torch.Tensor], tokens: torch.Tensor, mask: torch.Tensor,
              owner: torch.Tensor) -> torch.Tensor:
    """Per-response chain-rule estimate of KL(pi_own || pi_bar) for one prompt.

    logps[j]: [R, T, V] log-distributions of member j along every response; tokens [R, T]
    (padded), mask [R, T]; owner [R]: the member that sampled each response. With the
    posterior a_j(t) proportional to pi_j(y_<t) (uniform prior 1/N), the mixture's next-token
    distribution is pi_bar(v | y_<t) = sum_j a_j(t) pi_j(v | y_<t), and
    KL(pi_i || pi_bar) = E_{y~pi_i} sum_t KL(pi_i(.|y_<t) || pi_bar(.|y_<t)) exactly (chain
    rule), so each sampled response contributes a sum of exact per-step KLs over the
    vocabulary. Returns [R]; their mean over responses (M per member) estimates JS_pol_N(x)."""
    stacked = torch.stack(list(logps))  # [N, R, T, V]
    tok_lp = stacked.gather(-1, tokens.clamp(min=0)[None, :, :, None].expand(len(logps), -1, -1, 1))[..., 0]
    tok_lp = tok_lp * mask[None]  # [N, R, T]
    prefix = torch.cumsum(tok_lp, dim=-1) - tok_lp  # log pi_j(y_<t), [N, R, T]
    log_a = prefix - torch.logsumexp(prefix, dim=0, keepdim=True)  # log posterior, [N, R, T]
    log_bar = torch.logsumexp(log_a[..., None] + stacked, dim=0)  # [R, T, V]
    own = stacked[owner, torch.arange(len(owner))]  # [R, T, V]
    kl_t = (own.exp() * (own - log_bar)).sum(-1)  # [R, T]
    return (kl_t * mask).sum(-1)


def _flat(params: Sequence[tuple[str, torch.nn.Parameter]]) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).to(torch.float64) for _, p in params])


def fisher_trace(model: Any, params: Sequence[tuple[str, torch.nn.Parameter]], prompt_ids: Sequence[int],
                 responses: Sequence[Sequence[int]], temperature: float,
                 directions: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Score-function estimate of tr I_x(theta) = E_y ||grad log pi(y|x)||^2 from responses sampled at theta.

    For each response: log pi(y|x) = sum_t log softmax(logits/T)[y_t] (stop token included),
    backward, squared norm of the gradient over the ES-perturbed parameters (tied weights
    once), and its projections on ``directions`` [D, d] (offsets eps_i - eps_bar, used for
    the realised quadratic form of Appendix eq. app-local-js-expansion).
    Returns (sq_norms [M], projections [M, D])."""
    dev = next(model.parameters()).device
    sq, proj = [], []
    for y in responses:
        inp = torch.tensor([list(prompt_ids) + list(y)], dtype=torch.long, device=dev)
        lp = len(prompt_ids)
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=inp).logits[0, lp - 1:lp - 1 + len(y)]  # [T, V]
        logp = torch.log_softmax(logits.to(torch.float64) / temperature, dim=-1)
        total = logp.gather(-1, torch.tensor(y, device=dev)[:, None]).sum()
        total.backward()
        g = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(torch.float64)
                       for _, p in params]).cpu()
        sq.append(float(g @ g))
        proj.append((directions @ g).numpy())
    model.zero_grad(set_to_none=True)
    return np.asarray(sq), np.asarray(proj).reshape(len(responses), -1)


def run_lemma1(s: Lemma1Settings, progress: bool = True) -> dict[str, Any]:
    """Measure JS_pol_N(x) over the sigma grid and the Lemma 1 predictions (see the module docstring)."""
    from esreason import tasks
    from esreason.backends.base import SamplingParams
    from esreason.backends.hf import HFPolicy, load_model
    from esreason.backends.sampling import Sampler
    from esreason.es.population import draw_population

    s.check()
    t0 = time.perf_counter()
    task = tasks.get(s.task)
    problems = task.load(s.split, None, s.prompts)
    model, tok = load_model(s.model, "float32")
    if s.dtype == "float64":
        model = model.to(torch.float64)
    policy = HFPolicy(model, tok, master_weights="none", direction_cache_mb=0)
    params = policy.params.params  # the ES-perturbed tensors, tied weights once
    sampler = Sampler(model, tok)
    eos = int(tok.eos_token_id)
    prompts = [tasks.render_prompt(tok, p.messages) for p in problems]
    prompt_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    x, n, m = len(prompts), s.population, s.samples
    pops = [draw_population(s.seed, r, n, "one_point") for r in range(s.repeats)]

    def log(msg: str) -> None:
        if progress:
            print(f"[lemma1 {time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    # Unit directions eps_i (as the policy applies them), centred per population: [R*N, d].
    centre = _flat(params)
    dirs = []
    for pop in pops:
        eps = []
        for seed in pop.seeds:
            policy.perturb(seed, 1.0)
            eps.append(_flat(params) - centre)
            policy.restore()
        e = torch.stack(eps)
        dirs.append(e - e.mean(0, keepdim=True))
    directions = torch.cat(dirs)  # [R*N, d]
    del dirs
    if not torch.equal(_flat(params), centre):
        raise RuntimeError("the centre was not restored bit-exactly")

    # Fisher trace at the centre, per prompt.
    fisher = SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature, seed=s.seed * 1000 + 999)
    gen = sampler.generate([p for p in prompts for _ in range(s.fisher_samples)], fisher)
    tr_i, quad_unit = np.zeros(x), np.zeros((x, s.repeats))
    for k in range(x):
        ys = [_with_stop(gen.token_ids[k * s.fisher_samples + j], s.max_new_tokens, eos)
              for j in range(s.fisher_samples)]
        sq, proj = fisher_trace(model, params, prompt_ids[k], ys, s.temperature, directions)
        tr_i[k] = sq.mean()
        # (1/2N) sum_i E_y (g . (eps_i - eps_bar))^2 per population: the realised quadratic at sigma = 1.
        quad_unit[k] = (proj ** 2).mean(0).reshape(s.repeats, n).sum(-1) / (2 * n)
        log(f"prompt {k}: tr I_x = {tr_i[k]:.4g} ({s.fisher_samples} samples)")
    del directions

    rows = []
    for sigma in s.sigmas:
        js = np.zeros((x, s.repeats))
        js_se = np.zeros((x, s.repeats))
        for r, pop in enumerate(pops):
            texts: list[list[list[int]]] = [[[] for _ in range(n * m)] for _ in range(x)]  # [X][N*M]
            for i, seed in enumerate(pop.seeds):
                policy.perturb(seed, sigma)
                try:
                    g = sampler.generate([p for p in prompts for _ in range(m)],
                                         SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                                                        seed=s.seed * 1000 + r * n + i))
                finally:
                    policy.restore()
                for k in range(x):
                    for j in range(m):
                        texts[k][i * m + j] = _with_stop(g.token_ids[k * m + j], s.max_new_tokens, eos)
            logps: list[list[torch.Tensor]] = [[] for _ in range(x)]
            masks: list[torch.Tensor] = [torch.zeros(0)] * x
            for seed in pop.seeds:
                policy.perturb(seed, sigma)
                try:
                    for k in range(x):
                        lp_k, masks[k] = response_logprobs(model, prompt_ids[k], texts[k], s.temperature)
                        logps[k].append(lp_k)
                finally:
                    policy.restore()
            owner = torch.arange(n).repeat_interleave(m)  # [N*M]
            for k in range(x):
                t_max = masks[k].shape[1]
                tokens = torch.full((n * m, t_max), -1, dtype=torch.long)
                for q, y in enumerate(texts[k]):
                    tokens[q, :len(y)] = torch.tensor(y, dtype=torch.long)
                kl = policy_js(logps[k], tokens, masks[k], owner).numpy()  # [N*M]
                js[k, r] = kl.mean()
                js_se[k, r] = kl.std(ddof=1) / math.sqrt(len(kl)) if len(kl) > 1 else float("nan")
        if not torch.equal(_flat(params), centre):
            raise RuntimeError("the centre was not restored bit-exactly")
        pred = sigma ** 2 / 2 * (1 - 1 / n) * tr_i  # [X]
        quad = sigma ** 2 * quad_unit  # [X, R]
        row = {"sigma": sigma, "js_pol": float(js.mean()),
               "js_pol_se": float(np.sqrt((js_se ** 2).sum()) / js.size),
               "pred_lemma1": float(pred.mean()), "quad_realised": float(quad.mean()),
               "ratio_lemma1": float(js.mean() / pred.mean()) if pred.mean() > 0 else float("nan"),
               "ratio_realised": float(js.mean() / quad.mean()) if quad.mean() > 0 else float("nan"),
               "js_pol_per_prompt": js.mean(1).tolist(), "log_n": math.log(n)}
        rows.append(row)
        log(f"sigma={sigma:g}: JS_pol={row['js_pol']:.4g} ± {row['js_pol_se']:.2g}, "
            f"(σ²/2)(1-1/N) tr I={row['pred_lemma1']:.4g}, ratio {row['ratio_lemma1']:.3f}")
    for a, b in zip(rows, rows[1:]):
        if a["js_pol"] > 0 and b["js_pol"] > 0:
            b["slope"] = math.log(b["js_pol"] / a["js_pol"]) / math.log(b["sigma"] / a["sigma"])
    return {"settings": {**asdict(s), "sigmas": list(s.sigmas)}, "num_parameters": int(centre.numel()),
            "fisher_trace_per_prompt": tr_i.tolist(), "fisher_trace": float(tr_i.mean()), "rows": rows,
            "seconds": time.perf_counter() - t0}


def lemma1_report(res: dict[str, Any]) -> Table:
    st = res["settings"]
    t = Table(f"Lemma 1 on {st['model']} ({st['task']}, N={st['population']}, {st['dtype']})",
              ["σ", "JS_pol", "s.e.", "(σ²/2)(1−1/N) tr I", "JS / pred", "realised quadratic",
               "JS / quad", "log-log slope"],
              caption=f"tr I_x = {res['fisher_trace']:.4g} (mean over {st['prompts']} prompts, "
                      f"{st['fisher_samples']} score-function samples each; d = {res['num_parameters']}). "
                      f"JS_pol from {st['samples']} responses per member, {st['repeats']} populations, chain-rule "
                      f"KL; 'realised quadratic' = (1/2N) sum_i (Δ_i − mean Δ)^T I (Δ_i − mean Δ) for "
                      f"the drawn directions. "
                      f"Saturation ceiling log N = {math.log(st['population']):.3f} nats.")
    for r in res["rows"]:
        t.add(f"{r['sigma']:g}", fmt_sci(r["js_pol"]), fmt_sci(r["js_pol_se"], 1), fmt_sci(r["pred_lemma1"]),
              fmt(r["ratio_lemma1"], 3), fmt_sci(r["quad_realised"]), fmt(r["ratio_realised"], 3),
              fmt(r.get("slope"), 2) if r.get("slope") is not None else "--")
    return t


def plot_lemma1(res: dict[str, Any], path: Path) -> Path:
    """Log-log plot of JS_pol against sigma with the Lemma 1 line and the log N ceiling."""
    from esreason.analysis.plots import _save, plt

    rows = res["rows"]
    sig = np.array([r["sigma"] for r in rows])
    js = np.array([r["js_pol"] for r in rows])
    se = np.array([r["js_pol_se"] for r in rows])
    grid = np.geomspace(sig.min() / 1.5, sig.max() * 1.5, 50)
    n = res["settings"]["population"]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.errorbar(sig, js, yerr=2 * se, fmt="o-", capsize=3, label="JS_pol (measured, ±2 s.e.)")
    ax.plot(grid, grid ** 2 / 2 * (1 - 1 / n) * res["fisher_trace"], "--",
            label="(σ²/2)(1−1/N) tr I_x (Lemma 1)")
    ax.plot(sig, [r["quad_realised"] for r in rows], "x:", label="realised quadratic (drawn ε)")
    ax.axhline(math.log(n), color="grey", linewidth=0.9, linestyle="-.", label=f"log N = {math.log(n):.2f}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("σ")
    ax.set_ylabel("nats (mean over prompts)")
    ax.set_title(f"Lemma 1 on {res['settings']['model']} (N={n}, {res['settings']['dtype']})")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return _save(fig, path)


# =========================================================================== commands


def cmd_coverage(args: argparse.Namespace) -> int:
    from esreason.analysis.reports import emit
    from esreason.analysis.tables import dumps, render_markdown

    rows = load_coverage_rows(args.run)
    out = Path(args.out) if args.out else Path(args.run) / "plots" / "coverage"
    tables, payload = coverage_report(rows, args.run)
    paths = list(emit(out, "coverage", tables, payload).values())
    paths += plot_coverage(rows, out, f"Coverage diagnostics: {Path(args.run).name}")
    print(dumps(payload) if args.json else render_markdown(tables))
    print("wrote: " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


def cmd_lemma1(args: argparse.Namespace) -> int:
    from esreason.analysis.reports import emit
    from esreason.analysis.tables import dumps, render_markdown

    settings = Lemma1Settings(model=args.model, task=args.task, split=args.split, sigmas=parse_sigmas(args.sigmas),
                              population=args.population, prompts=args.prompts, samples=args.samples,
                              fisher_samples=args.fisher_samples, repeats=args.repeats,
                              max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              dtype=args.dtype, seed=args.seed)
    res = run_lemma1(settings, progress=not args.no_progress)
    out = Path(args.out)
    table = lemma1_report(res)
    paths = list(emit(out, "lemma1", [table], res).values())
    paths.append(plot_lemma1(res, out / "lemma1.png"))
    print(dumps(res) if args.json else render_markdown([table]))
    print("wrote: " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``coverage`` and ``lemma1`` on the ``analyze`` sub-parsers."""
    p = sub.add_parser("coverage", help="population coverage diagnostics of an ES run (P_pop vs P_same, JS_succ, "
                                        "Cov(w,p), Proposition 1)")
    p.add_argument("run", help="ES run directory trained with coverage.every > 0")
    p.add_argument("--out", default=None, help="output directory (default RUN/plots/coverage)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the Markdown tables")
    p.set_defaults(func=cmd_coverage)

    d = Lemma1Settings()
    p = sub.add_parser("lemma1", help="numerical check of Lemma 1: JS_pol vs (σ²/2)(1−1/N) tr I_x over a σ grid")
    p.add_argument("--model", default=d.model, help="'demo' or a HF model directory (default demo)")
    p.add_argument("--task", default=d.task, help=f"task whose prompts are used (default {d.task})")
    p.add_argument("--split", default=d.split, help=f"dataset split (default {d.split})")
    p.add_argument("--sigmas", default=",".join(f"{v:g}" for v in d.sigmas), help="comma-separated σ grid")
    p.add_argument("--population", type=int, default=d.population, help=f"N (default {d.population})")
    p.add_argument("--prompts", type=int, default=d.prompts, help=f"prompts (default {d.prompts})")
    p.add_argument("--samples", type=int, default=d.samples,
                   help=f"responses per member and prompt for JS_pol (default {d.samples})")
    p.add_argument("--fisher-samples", type=int, default=d.fisher_samples,
                   help=f"centre responses per prompt for tr I_x (default {d.fisher_samples})")
    p.add_argument("--repeats", type=int, default=d.repeats, help=f"populations per σ (default {d.repeats})")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help=f"(default {d.max_new_tokens})")
    p.add_argument("--temperature", type=float, default=d.temperature,
                   help=f"policy temperature: pi = softmax(logits/T) (default {d.temperature})")
    p.add_argument("--dtype", default=d.dtype, help="float32 (default, what ES samples from) or float64 (same numbers on the demo, about 3x slower)")
    p.add_argument("--seed", type=int, default=d.seed, help="population and sampling seed (default 0)")
    p.add_argument("--out", default=str(Path("runs") / "analysis" / "lemma1"), help="output directory")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the Markdown table")
    p.add_argument("--no-progress", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_lemma1)
