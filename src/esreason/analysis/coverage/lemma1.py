"""``esreason analyze lemma1``: a numerical check of Lemma 1 (paper §RQ1 theory; docs/coverage.md).

On a model (default: the embedded demo), the population's policy JS divergence JS_pol_N(x)
against the small-sigma law (sigma^2 / 2)(1 - 1/N) tr I_x(theta), over a sigma grid:
:func:`run_lemma1` measures, :func:`lemma1_report` tabulates. The estimators are in
:mod:`esreason.analysis.coverage.divergence`, the plot in :mod:`esreason.analysis.coverage.plots`.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from esreason.analysis.coverage.divergence import fisher_trace, flat_params, policy_js, response_logprobs, with_stop
from esreason.analysis.tables import Table, fmt, fmt_sci
from esreason.errors import UserError

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
    prompts = [tasks.problem_prompt(tok, p) for p in problems]
    prompt_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    x, n, m = len(prompts), s.population, s.samples
    pops = [draw_population(s.seed, r, n, "one_point") for r in range(s.repeats)]

    def log(msg: str) -> None:
        if progress:
            print(f"[lemma1 {time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    # Unit directions eps_i (as the policy applies them), centred per population: [R*N, d].
    centre = flat_params(params)
    dirs = []
    for pop in pops:
        eps = []
        for seed in pop.seeds:
            policy.perturb(seed, 1.0)
            eps.append(flat_params(params) - centre)
            policy.restore()
        e = torch.stack(eps)
        dirs.append(e - e.mean(0, keepdim=True))
    directions = torch.cat(dirs)  # [R*N, d]
    del dirs
    if not torch.equal(flat_params(params), centre):
        raise RuntimeError("the centre was not restored bit-exactly")

    # Fisher trace at the centre, per prompt.
    fisher = SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature, seed=s.seed * 1000 + 999)
    gen = sampler.generate([p for p in prompts for _ in range(s.fisher_samples)], fisher)
    tr_i, quad_unit = np.zeros(x), np.zeros((x, s.repeats))
    for k in range(x):
        ys = [with_stop(gen.token_ids[k * s.fisher_samples + j], s.max_new_tokens, eos)
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
                        texts[k][i * m + j] = with_stop(g.token_ids[k * m + j], s.max_new_tokens, eos)
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
        if not torch.equal(flat_params(params), centre):
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


__all__ = ["Lemma1Settings", "lemma1_report", "parse_sigmas", "run_lemma1"]
