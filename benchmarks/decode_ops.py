"""Benchmark: ATen operations and host syncs per decode step, our Sampler vs transformers' ``generate``.

Why: on an H100 the Sampler's CPU-tuned loop decoded a random-weight Qwen2.5-1.5B at 0.58-0.59x
``generate``'s tokens/s (shared/gpu-results/2026-11-28-h100/gen_cmp.txt). At 1.5B a one-token step
is launch-bound: every ATen call is a dispatch and, unless it only makes a view, a kernel launch;
every host read of a device value (``.item()``, ``int(t)``, ``bool(t)``, ``nonzero``) stalls the
launch queue. Both are counted here with ``torch.profiler`` on the CPU, where the counts are the same
calls a CUDA run makes outside the kernels (the model, the cache and the loop are the same Python):

  aten_ops      every ``aten::`` event, nested ones included (``linear`` and the ``addmm`` it calls)
  top_level     ``aten::`` events with no ``aten::`` ancestor: the calls made from Python
  host_syncs    ``aten::_local_scalar_dense`` (behind ``item``/``int``/``bool``/``is_nonzero``) and
                ``aten::nonzero``; device-to-host copies (``.cpu()``, ``.tolist()``) do not show on a
                CPU run, so the loops were read for them: neither makes one per step
  per_op        ``aten_ops`` by name

Per step = the counts of the last 32 full steps of a run of L new tokens / 32 (the profiler runs
from the start of one forward call to the start of the forward 32 calls later: prefill, setup and the
per-chunk result copies are outside; the window KV buffers' widening, every 16 positions, is averaged
over whole blocks). Engines:

  sampler_cpu_loop    ``Sampler(loop="cpu", cache="auto")``: the loop every device ran before the CUDA loop existed
                      (still the CPU default; with ``sdpa`` attention as the CUDA run had it)
  sampler_cuda_loop   ``Sampler(loop="cuda")``: what the sampler runs on CUDA now
  generate            ``model.generate`` greedy, dynamic cache (the H100's fastest)

Model: Qwen2.5-1.5B's layer structure (Qwen2, 28 layers, 12 query / 2 KV heads, RMSNorm, RoPE,
SwiGLU MLP, ``sdpa``) at a narrow width (hidden 96, MLP 64, vocabulary 1,024, random fp32 weights):
op counts per step do not depend on width, only on the layer structure and the loop. The output
embedding is untied with the EOS row zeroed, so EOS (logit 0) never wins an argmax against 1,023
random logits and every row runs its full budget in both EOS modes:

  --eos ignored   (default) as on the H100: Sampler ``ignore_eos=True``, generate with
                  ``min_new_tokens = L`` (its EOS stopping criterion and min-length processor run)
  --eos live      both stop at EOS (it never fires): the production setting

Prompts: B rows of equal length (as gen_cmp.py's), or ``--padded`` (lengths 6-13: left padding).
Greedy tokens of the cuda loop are checked against ``generate``'s (``tokens_equal``).

Prints ONE JSON object. Usage:
  python benchmarks/decode_ops.py [--shapes 16x128,64x256] [--layers 28] [--eos ignored|live] [--padded]
  python benchmarks/decode_ops.py --device cuda --width full --time   # tokens/s at real 1.5B shapes
(``--time`` measures wall time instead of counting; only meaningful on an idle GPU machine.)
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

STEADY = 32  # decode steps profiled per run (two window blocks of 16)
SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero")
EOS_ID = 2  # the embedded tokenizer's EOS (build_tokenizer), also the model's


def build(layers: int = 28, width: str = "narrow", device: str = "cpu", dtype: torch.dtype = torch.float32,
          seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer): a random-weight Qwen2 with Qwen2.5-1.5B's layer structure.

    width "narrow": hidden 96 (12 heads x 8), MLP 64, vocabulary 1,024; "full": the 1.5B's hidden
    1,536, MLP 8,960, vocabulary 151,936. The output embedding is untied, its EOS row zero.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from esreason.embedded import build_tokenizer

    tok = build_tokenizer()
    dims = dict(hidden_size=96, intermediate_size=64, vocab_size=1024) if width == "narrow" else \
        dict(hidden_size=1536, intermediate_size=8960, vocab_size=151936)
    cfg = Qwen2Config(**dims, num_hidden_layers=layers, num_attention_heads=12, num_key_value_heads=2,
                      tie_word_embeddings=False, max_position_embeddings=4096, attn_implementation="sdpa",
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    assert tok.eos_token_id == EOS_ID
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():
        model.lm_head.weight[EOS_ID].zero_()
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def prompts(batch: int, padded: bool = False) -> list[list[int]]:
    """``batch`` prompts of token ids (BOS first): 11 ids each, or 6-13 ids with ``padded``."""
    out = []
    for i in range(batch):
        n = 6 + (i * 5) % 8 if padded else 11
        out.append([1] + [5 + (7 * i + 3 * j) % 90 for j in range(n - 1)])
    return out


def tally(prof: Any) -> dict[str, Any]:
    """{aten_ops, top_level, host_syncs, per_op} of a finished CPU profile (see the module docstring)."""
    events = [e for e in prof.events() if e.name.startswith("aten::")]

    def top(e: Any) -> bool:
        p = e.cpu_parent
        while p is not None:
            if p.name.startswith("aten::"):
                return False
            p = p.cpu_parent
        return True

    per_op = collections.Counter(e.name for e in events)
    return {"aten_ops": len(events), "top_level": sum(1 for e in events if top(e)),
            "host_syncs": sum(per_op[n] for n in SYNC_OPS), "per_op": dict(per_op)}


class StepWindow:
    """Profiles the CPU from the start of the model's forward call number ``first`` (0 = the prefill)
    to the start of call ``first + steps``: exactly ``steps`` decode steps (a forward and the loop's
    work after it), whatever the engine does before and after them."""

    def __init__(self, model: Any, first: int, steps: int) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.prof = profile(activities=[ProfilerActivity.CPU])
        self.first, self.last, self.calls, self.closed = first, first + steps, 0, False
        self.handle = model.register_forward_pre_hook(self._pre)

    def _pre(self, module: Any, args: Any) -> None:
        if self.calls == self.first:
            self.prof.start()
        elif self.calls == self.last:
            self.prof.stop()
            self.closed = True
        self.calls += 1

    def result(self) -> dict[str, Any]:
        self.handle.remove()
        if not self.closed:
            raise RuntimeError(f"the run made {self.calls} forward calls, fewer than {self.last + 1}")
        return tally(self.prof)


def engines(model: Any, tok: Any, rows: list[list[int]], eos: str) -> dict[str, Callable[[int], Any]]:
    """name -> run(L): one greedy call of L new tokens per row; returns the token ids [B][L]."""
    from esreason.backends.base import SamplingParams
    from esreason.backends.sampling import Sampler

    ignore = eos == "ignored"

    def sampler(loop: str, cache: str) -> Callable[[int], Any]:
        s = Sampler(model, tok, batch_size=len(rows), loop=loop, cache=cache)
        return lambda n: s.generate_ids(rows, SamplingParams(max_new_tokens=n), ignore_eos=ignore).token_ids

    width = max(len(r) for r in rows)
    dev = next(model.parameters()).device
    ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows], device=dev)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=dev)

    def generate(n: int) -> Any:
        kw = dict(max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
        if ignore:
            kw["min_new_tokens"] = n
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, **kw)
        return out[:, width:].tolist()

    return {"sampler_cpu_loop": sampler("cpu", "auto"), "sampler_cuda_loop": sampler("cuda", "auto"),
            "generate": generate}


def per_step(model: Any, run: Callable[[int], Any], new_tokens: int) -> tuple[dict[str, Any], Any]:
    """Counts per decode step over the last :data:`STEADY` full steps of a run of ``new_tokens`` (forward
    calls ``new_tokens - STEADY - 1`` .. ``new_tokens - 2`` and the work after each), and the run's tokens."""
    run(4)  # warm-up
    window = StepWindow(model, new_tokens - STEADY - 1, STEADY)
    toks = run(new_tokens)
    counts = window.result()
    out: dict[str, Any] = {k: counts[k] / STEADY for k in ("aten_ops", "top_level", "host_syncs")}
    out["per_op"] = {k: v / STEADY for k, v in sorted(counts["per_op"].items(), key=lambda kv: -kv[1])}
    return out, toks


def measure(batch: int, new_tokens: int, *, layers: int = 28, eos: str = "ignored", padded: bool = False,
            per_op: bool = False) -> dict[str, Any]:
    """Per-step counts of every engine at one shape (CPU, narrow width), with the ratios to generate's."""
    if new_tokens <= STEADY + 1:
        raise SystemExit(f"--shapes: new tokens must exceed {STEADY + 1}, got {new_tokens}")
    torch.set_num_threads(1)
    model, tok = build(layers)
    rows = prompts(batch, padded)
    result: dict[str, Any] = {"batch": batch, "new_tokens": new_tokens}
    tokens = {}
    for name, run in engines(model, tok, rows, eos).items():
        counts, tokens[name] = per_step(model, run, new_tokens)
        if not per_op:
            counts.pop("per_op")
        result[name] = counts
    if any(len(r) != new_tokens for t in tokens.values() for r in t):
        raise RuntimeError("a row stopped early: per-step counts would not be steady")
    result["tokens_equal"] = tokens["sampler_cuda_loop"] == tokens["generate"]
    gen = result["generate"]
    for name in ("sampler_cpu_loop", "sampler_cuda_loop"):
        result[f"{name}_vs_generate"] = {k: round(result[name][k] / gen[k], 3) if gen[k] else None
                                         for k in ("aten_ops", "top_level", "host_syncs")}
    return result


def time_engines(batch: int, new_tokens: int, *, width: str, device: str, repeats: int, eos: str) -> dict[str, Any]:
    """tokens/s of every engine (bf16 on CUDA), alternating engines within each repeat; the median."""
    import statistics

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model, tok = build(28, width, device, dtype)
    runs = engines(model, tok, prompts(batch), eos)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for run in runs.values():
        run(4)
    secs: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            sync()
            t0 = time.perf_counter()
            run(new_tokens)
            sync()
            secs[name].append(time.perf_counter() - t0)
    tps = {k: batch * new_tokens / statistics.median(v) for k, v in secs.items()}
    return {"batch": batch, "new_tokens": new_tokens, "tokens_per_s": tps,
            "cuda_loop_vs_generate": tps["sampler_cuda_loop"] / tps["generate"],
            "cpu_loop_vs_generate": tps["sampler_cpu_loop"] / tps["generate"]}


def main(argv: list[str] | None = None) -> None:
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="16x128,64x256", help="BxL pairs: prompts x new tokens")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--eos", choices=("ignored", "live"), default="ignored")
    ap.add_argument("--padded", action="store_true", help="prompts of 6-13 tokens (left padding)")
    ap.add_argument("--per-op", action="store_true", help="also print the per-op counts")
    ap.add_argument("--time", action="store_true", help="measure tokens/s instead of counting")
    ap.add_argument("--device", default="cpu", help="with --time: cpu or cuda")
    ap.add_argument("--width", choices=("narrow", "full"), default="narrow", help="with --time")
    ap.add_argument("--repeats", type=int, default=3, help="with --time")
    args = ap.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    out: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__,
                           "eos": args.eos, "padded": args.padded}
    if args.time:
        out["device"] = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        out["timed"] = [time_engines(b, n, width=args.width, device=args.device, repeats=args.repeats,
                                     eos=args.eos) for b, n in shapes]
    else:
        out["model"] = f"Qwen2.5-1.5B layer structure, {args.layers} layers, narrow (hidden 96), fp32, CPU"
        out["shapes"] = [measure(b, n, layers=args.layers, eos=args.eos, padded=args.padded, per_op=args.per_op)
                         for b, n in shapes]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
