"""GPU acceptance (issue 35, item 2): the real commands on one CUDA device, from source, in one JSON.

Made for the lent offline GPU machine (one H100, torch 2.11, transformers 5.17, Python 3.12, no
TRL/datasets/math-verify, at most 64 MiB carried): ``scripts/gpu-acceptance.sh`` installs the few
wheels ``scripts/gpu-wheels.sh`` fetched beforehand (``pip install --no-index --no-deps
--target``), puts ``src`` and that directory on ``PYTHONPATH`` and runs this driver. Sections,
each recorded as it finishes (``--json``, default ``$OUT/gpu_acceptance.json``):

- ``setup``: a random-weight bf16 Qwen2 at Qwen2.5-1.5B shapes saved as a local HF directory
  with the embedded tokenizer, and the embedded default's pretrained weights saved in bf16
  (benchmarks/gpu_acceptance_local.py says why both);
- ``es_resume`` (1.5B shapes) and ``es_resume_embedded`` (CUDA only; on the CPU twin
  ``es_resume`` already runs the embedded weights): ``esreason train es``, 3 updates, then
  ``--resume-from step_2``: the final checkpoint's weights and fp32 masters hash the same;
- ``grpo``: ``esreason train grpo`` through TRL without vLLM, Easy's micro-batch 2, activation
  checkpointing, bf16 and KL, 2 updates, rollout and train seconds per update; ``grpo_plan``:
  the plan's terms for the same run (``esreason.experiments.plan.build_plan``, one H100);
- ``eval``: ``esreason eval`` with Pass@1 and Pass@K on the first demo-add problems;
- ``sampler_vs_generate``: the HF sampler against transformers' ``generate`` (16 x 128 and
  64 x 256 on the GPU).

They run in the order of ``SECTIONS`` (es_resume_embedded last). A failed section carries
``error`` and the later sections still run; on CUDA none starts after ``--deadline-s`` (330 s: the
device call's 8 minutes less the machine's start) and no child runs past it. The process exits 1
naming every failed or unstarted section. ``--tiny --device cpu`` is the CPU twin (tests/test_gpu_acceptance.py).
Times are reported, never checked.

Usage: scripts/gpu-acceptance.sh [--tiny] [--device cuda|cpu] [--sections a,b] [--json PATH]
                                 [--grpo-set KEY=VALUE ...] [--work DIR]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_acceptance_local as local  # noqa: E402
import gpu_acceptance_runs as runs  # noqa: E402

#: in the order they run: the issue's list first, the extra ES run on the embedded weights last
SECTIONS = ("es_resume", "grpo", "grpo_plan", "eval", "sampler_vs_generate", "es_resume_embedded")
#: shapes per section: the GPU run's, and the CPU twin's (--tiny)
SHAPES: dict[bool, dict[str, Any]] = {
    False: {"es": {"population": 4, "prompts": 4, "tokens": 32},
            "es_embedded": {"population": 4, "prompts": 4, "tokens": 64},
            "grpo": {"prompts": 2, "generations": 8, "tokens": 64},
            "eval": {"limit": 8, "samples": 4, "tokens": 32},
            "generate": [(16, 128), (64, 256)]},
    # the embedded default needs ~40 tokens to reach its boxed answer (64, as configs/demo/*.yaml)
    True: {"es": {"population": 4, "prompts": 4, "tokens": 64},
           "grpo": {"prompts": 2, "generations": 4, "tokens": 64},
           "eval": {"limit": 4, "samples": 4, "tokens": 64},
           "generate": [(2, 8), (4, 12)]},
}
#: the model the CPU twin's plan section prices (offline parameter count; the GPU run plans its own directory)
PLAN_MODEL = "Qwen/Qwen2.5-1.5B-Instruct"
#: per-child timeout (s): far above the H100 estimates in docs/scale.md, far below the booking
CHILD_TIMEOUT_S = 240.0
#: the driver's deadline on CUDA (s): no section starts after it, no child runs past it; with the
#: machine's start (~90 s) and the wheels (~10 s) the device call stays inside 8 minutes
CUDA_DEADLINE_S = 330.0


def versions() -> dict[str, Any]:
    """Versions and where each package was imported from (the wheels' --target directory or not)."""
    out: dict[str, Any] = {"python": sys.version.split()[0], "cuda": torch.version.cuda}
    for name in ("torch", "transformers", "trl", "datasets", "math_verify", "accelerate", "pyarrow", "fsspec",
                 "huggingface_hub", "tokenizers"):
        try:
            mod = importlib.import_module(name)
            out[name] = {"version": getattr(mod, "__version__", None), "from": str(Path(mod.__file__).parent.parent)}
        except Exception as exc:  # noqa: BLE001 -- a missing package is a finding, reported as such
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


class Recorder:
    """The result object, written to ``path`` after every section (a killed run keeps what it did)."""

    def __init__(self, path: Path | None, head: dict[str, Any], deadline_s: float | None) -> None:
        self.path, self.result, self.t0 = path, dict(head), time.perf_counter()
        self.deadline_s = deadline_s
        self.result.update(section_s={}, failed=[], deadline_s=deadline_s)

    def remaining(self) -> float:
        return float("inf") if self.deadline_s is None else self.deadline_s - (time.perf_counter() - self.t0)

    def child_timeout(self) -> float:
        """A child's limit: CHILD_TIMEOUT_S, or what is left before the deadline."""
        return max(1.0, min(CHILD_TIMEOUT_S, self.remaining()))

    def section(self, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        t0 = time.perf_counter()
        try:
            if self.remaining() <= 0:
                raise TimeoutError(f"not started: the {self.deadline_s:.0f} s deadline had passed")
            out = fn()
        except Exception as exc:  # noqa: BLE001 -- every section reports, failed ones included
            out = {"error": f"{type(exc).__name__}: {exc}", "ok": False}
        self.result[name] = out
        self.result["section_s"][name] = time.perf_counter() - t0
        if not out.get("ok", False):
            self.result["failed"].append(name)
        self.write()
        return out

    def write(self) -> None:
        self.result["total_s"] = time.perf_counter() - self.t0
        self.result["ok"] = not self.result["failed"]
        if self.path is not None:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.result, indent=2, default=str))
            os.replace(tmp, self.path)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_acceptance: --device cuda but torch.cuda.is_available() is False "
                         "(use --tiny --device cpu for the CPU twin)")
    shapes = SHAPES[args.tiny]
    on_gpu = args.device.startswith("cuda")
    head = {"device": args.device, "device_name": torch.cuda.get_device_name() if on_gpu else "cpu",
            "tiny": args.tiny, "versions": versions(), "shapes": shapes}
    rec = Recorder(args.json, head, args.deadline_s)
    models: dict[str, str] = {}

    def setup() -> dict[str, Any]:
        embedded = local.build_embedded_model(work / "embedded")
        models["embedded"] = embedded["path"]
        out = {"embedded": embedded}
        if not args.tiny:
            out["shape"] = local.build_shape_model(work / "shape", False, args.device)
            if on_gpu:
                torch.cuda.empty_cache()
        models["main"] = out["shape"]["path"] if "shape" in out else embedded["path"]
        return {**out, "ok": True}

    wanted = set(args.sections)
    rec.section("setup", setup)
    if "main" not in models:
        return rec.result
    main_model, timeout = models["main"], rec.child_timeout
    if "es_resume" in wanted:
        rec.section("es_resume", lambda: runs.es_resume(main_model, work, args.device, shapes["es"], timeout()))
    if "grpo" in wanted:
        rec.section("grpo", lambda: runs.grpo(main_model, work, args.device, shapes["grpo"], timeout(), args.grpo_set))
    if "grpo_plan" in wanted:
        # the twin's embedded model (0.87M) is below the plan's throughput table: plan the GPU run's size
        plan_model = PLAN_MODEL if args.tiny else main_model
        mapping = runs.grpo_mapping(runs.grpo_overrides(plan_model, "cuda", shapes["grpo"]) + args.grpo_set)
        rec.section("grpo_plan", lambda: {**local.grpo_plan_terms(plan_model, mapping, 2), "ok": True})
        done = rec.result.get("grpo", {})
        if done.get("phases_s"):  # the measured phases beside the plan's decode and train terms
            measured = {k: sum(v) for k, v in done["phases_s"].items()}
            measured["rest_of_command"] = done["command_s"] - sum(measured.values())  # start, load, checkpoint
            rec.result["grpo_plan"]["measured_s"] = measured
            rec.write()
    if "eval" in wanted:
        rec.section("eval", lambda: runs.evaluate(main_model, work, args.device, shapes["eval"], timeout()))
    if "sampler_vs_generate" in wanted:
        rec.section("sampler_vs_generate",
                    lambda: local.sampler_vs_generate(args.tiny, args.device, shapes["generate"]))
    if "es_resume_embedded" in wanted and not args.tiny:
        rec.section("es_resume_embedded",
                    lambda: runs.es_resume(models["embedded"], work, args.device, shapes["es_embedded"], timeout()))
    return rec.result


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="the CPU twin's shapes (embedded weights, tiny runs)")
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    ap.add_argument("--json", type=Path, default=None, help="result file, rewritten after every section "
                    "(default: $OUT/gpu_acceptance.json when OUT is set)")
    ap.add_argument("--grpo-set", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra override of the GRPO run (and of its plan), e.g. grpo.micro_batch_size=4")
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help=f"no section starts after this many seconds "
                         f"(default: {CUDA_DEADLINE_S:.0f} on CUDA, none on CPU)")
    args = ap.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.deadline_s is None and args.device.startswith("cuda"):
        args.deadline_s = CUDA_DEADLINE_S
    args.sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(args.sections) - set(SECTIONS))
    if unknown:
        ap.error(f"--sections: unknown {unknown[0]!r}; choose from {', '.join(SECTIONS)}")
    if args.json is None and os.environ.get("OUT"):
        args.json = Path(os.environ["OUT"]) / "gpu_acceptance.json"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="esreason-acceptance-", dir=args.work) as tmp:
        result = run(args, Path(tmp))
    print(json.dumps(result, indent=2, default=str))
    for name in result["failed"]:
        print(f"gpu-acceptance: section {name} failed: {result[name].get('error', 'a check is false')}",
              file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
