"""What an experiment downloads into the Hugging Face caches and writes as evaluation outputs, in
bytes, for the launch disk check (:mod:`esreason.experiments.diskcheck`).

- **Models** (``HF_HUB_CACHE``): every hub model the experiment loads (its ``model``, a
  ``checkpoints:`` entry that is a hub id) and that the cache does not hold yet: its weights' bytes,
  the parameter count of its architecture (:mod:`esreason.io.architectures`, the ``config.json``
  values shipped with the package) times the bytes of the dtype its ``config.json`` names
  (``torch_dtype``; bf16 when it names none). A model whose architecture is not shipped is not
  priced (named in :func:`unpriced_models`).
- **Datasets**: every paper task the experiment trains or evaluates on that is read from the hub
  (no local copy under ``data_dir`` or ``data_path``) and not cached yet: the download in
  ``HF_HUB_CACHE`` (``datasets`` fetches hub files through ``huggingface_hub``) plus the Arrow copy
  ``datasets`` writes in ``HF_DATASETS_CACHE``. ``load_dataset`` prepares every split of the
  config, not only the one read. The sizes are our stated upper bounds (:data:`DATASET_MIB`).
- **Evaluation outputs** (under ``--output``): ``responses.jsonl`` of every evaluated model
  (``eval/<m>`` stages of :func:`esreason.experiments.spec.run_stages`), one record per problem and
  sample (and one greedy response with ``eval.greedy``): :data:`RECORD_BYTES` of fields plus the response's text at :data:`BYTES_PER_TOKEN`, with
  the plan's mean response length for the model family capped at ``eval.max_new_tokens``.

A cache directory counts as holding a repository when ``<kind>s--<org>--<name>/snapshots`` has a
file (models: a ``*.safetensors`` or ``*.bin`` file). The cache locations follow
``huggingface_hub`` and ``datasets``: ``HF_HUB_CACHE`` (or ``HUGGINGFACE_HUB_CACHE``, else
``HF_HOME/hub``) and ``HF_DATASETS_CACHE`` (else ``HF_HOME/datasets``), ``HF_HOME`` defaulting to
``$XDG_CACHE_HOME/huggingface`` or ``~/.cache/huggingface``; read at call time.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from esreason.errors import UserError

MIB = 2 ** 20
#: Bytes of one responses.jsonl record besides the response text: task, problem id, sample, token
#: count, entropy, extracted answer, verdict, reason, fingerprint (measured: ~340 on demo-add records).
RECORD_BYTES = 400
#: Bytes of response text per generated token (assumption (ours): ~4 characters per BPE token of
#: English and LaTeX, plus JSON escapes; the character-level embedded default writes fewer).
BYTES_PER_TOKEN = 4.5
#: Problems of a task whose test size is not known here and that the experiment does not limit.
DEFAULT_PROBLEMS = 1000
#: Download MiB of each paper dataset's hub files, all splits of the config (assumption (ours): upper
#: bounds above the hub pages' file sizes, which we could not check offline; the benchmark sets are a
#: few MiB, HotpotQA's distractor config carries ten context paragraphs per question for ~90k training
#: questions). The Arrow copy is :data:`ARROW_FACTOR` times this.
DATASET_MIB: dict[str, float] = {
    "openai/gsm8k": 20, "HuggingFaceH4/MATH-500": 20, "math-ai/aime24": 5, "math-ai/aime25": 5, "math-ai/amc23": 5,
    "agentica-org/DeepScaleR-Preview-Dataset": 100, "tau/commonsense_qa": 20, "Idavidrein/gpqa": 20,
    "hotpotqa/hotpot_qa": 1024, "HuggingFaceTB/Countdown-Task-GOLD": 200, "google-research-datasets/mbpp": 10,
}
#: A hub dataset not in :data:`DATASET_MIB` (assumption (ours)).
DEFAULT_DATASET_MIB = 200.0
#: Arrow bytes per downloaded byte (assumption (ours): Arrow stores the text uncompressed; Parquet
#: compresses text 2-3x, JSON not at all).
ARROW_FACTOR = 2.0


def _home(env: Mapping[str, str]) -> Path:
    xdg = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(os.path.expanduser(env.get("HF_HOME") or os.path.join(xdg, "huggingface")))


def hub_cache(env: Mapping[str, str] | None = None) -> Path:
    """``huggingface_hub``'s cache directory (models and dataset files)."""
    env = os.environ if env is None else env
    raw = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    return Path(os.path.expanduser(raw)) if raw else _home(env) / "hub"


def datasets_cache(env: Mapping[str, str] | None = None) -> Path:
    """``datasets``' cache directory (the Arrow copies)."""
    env = os.environ if env is None else env
    raw = env.get("HF_DATASETS_CACHE")
    return Path(os.path.expanduser(raw)) if raw else _home(env) / "datasets"


def cached(kind: str, repo_id: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether the hub cache holds ``repo_id`` (``kind``: "model" or "dataset")."""
    snapshots = hub_cache(env) / f"{kind}s--{repo_id.replace('/', '--')}" / "snapshots"
    if not snapshots.is_dir():
        return False
    wanted = ("*.safetensors", "*.bin") if kind == "model" else ("*",)
    return any(p.is_file() for pattern in wanted for p in snapshots.glob(f"*/**/{pattern}"))


def _is_hub_id(model: str) -> bool:
    return model != "demo" and not Path(model).exists() and model.count("/") == 1


def hub_models(spec: Any) -> list[str]:
    """The hub models ``spec`` loads: its model and every checkpoint method's hub id."""
    names = [spec.model] + [m.checkpoint for m in spec.methods if m.checkpoint]
    return [m for m in dict.fromkeys(names) if _is_hub_id(str(m))]


def model_bytes(model: str) -> int | None:
    """Bytes of ``model``'s weights as published (its config's dtype), or None for an unshipped architecture."""
    from esreason.io.architectures import architecture, parameter_count

    try:
        arch = architecture(model)
    except UserError:
        return None
    dtype = str(arch.get("torch_dtype") or arch.get("dtype") or "bfloat16")
    return parameter_count(arch) * (4 if dtype == "float32" else 2)


def unpriced_models(spec: Any, env: Mapping[str, str] | None = None) -> list[str]:
    """Hub models to download whose size is not known here (not counted)."""
    return [m for m in hub_models(spec) if not cached("model", m, env) and model_bytes(m) is None]


def model_download_bytes(spec: Any, env: Mapping[str, str] | None = None) -> dict[str, int]:
    """``{hub id: bytes}`` of the models ``spec`` still has to download."""
    out = {}
    for m in hub_models(spec):
        n = None if cached("model", m, env) else model_bytes(m)
        if n:
            out[m] = n
    return out


def _local_copy(spec: Any, task: str) -> bool:
    """Whether ``task`` is read from files rather than the hub (``data_dir/<task>``, a run config's data_path)."""
    if spec.data_dir and (Path(spec.data_dir) / task).exists():
        return True
    return any(cfg is not None and cfg.task == task and cfg.data_path for cfg in (spec.es, spec.grpo))


def dataset_download_bytes(spec: Any, env: Mapping[str, str] | None = None) -> dict[str, tuple[int, int]]:
    """``{hub id: (download bytes, Arrow bytes)}`` of the paper datasets ``spec`` still has to fetch."""
    from esreason.tasks.paper import SOURCES

    out: dict[str, tuple[int, int]] = {}
    for task in dict.fromkeys([spec.task, *spec.eval.tasks]):
        source = SOURCES.get(task)
        if source is None or _local_copy(spec, task) or cached("dataset", source.hub_id, env):
            continue
        mib = DATASET_MIB.get(source.hub_id, DEFAULT_DATASET_MIB)
        out[source.hub_id] = (int(mib * MIB), int(ARROW_FACTOR * mib * MIB))
    return out


def _problems(spec: Any, task: str) -> int:
    from esreason.experiments import plan_table as tab

    limit = spec.eval.limit
    if task in tab.TEST_SIZES:
        n = tab.TEST_SIZES[task][0]
    else:
        try:
            from esreason import tasks

            data = Path(spec.data_dir) / task if spec.data_dir and (Path(spec.data_dir) / task).exists() else None
            n = len(tasks.get(task).load("test", data, limit))
        except UserError:  # not loadable here (hub-only, offline): the stated default
            n = DEFAULT_PROBLEMS
    return min(n, limit) if limit else n


def eval_output_bytes(spec: Any) -> int:
    """Bytes of the ``responses.jsonl`` files every evaluation of ``spec`` writes under ``--output``."""
    from esreason.experiments import plan_table as tab
    from esreason.experiments.spec import run_stages

    p = spec.eval
    evaluations = sum(1 for _name, kind, _u in run_stages(spec) if kind == "eval")
    tokens = min(tab.response_tokens(spec.model).value, p.max_new_tokens)
    per_record = RECORD_BYTES + BYTES_PER_TOKEN * tokens
    records = sum(_problems(spec, t) for t in p.tasks) * (max(1, p.samples) + (1 if p.greedy else 0))
    return int(evaluations * records * per_record)


__all__ = ["ARROW_FACTOR", "BYTES_PER_TOKEN", "DATASET_MIB", "RECORD_BYTES", "cached", "datasets_cache",
           "dataset_download_bytes", "eval_output_bytes", "hub_cache", "hub_models", "model_bytes",
           "model_download_bytes", "unpriced_models"]
