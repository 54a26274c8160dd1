"""Sequential compositions ES->GRPO and GRPO->ES (paper §"Sequentially Mixed Training").

"Under the same total update budget, we additionally split training equally between two
stages": a composition with budget T runs stage 1 for ``T // 2`` updates and stage 2 for
``T - T // 2`` updates (an odd T gives the extra update to stage 2; T < 2 cannot be split),
and stage 2 starts from stage 1's final checkpoint. Every number of the paper's tables
uses the same T for single methods and compositions, so a composition costs the same
number of updates as one ES or one GRPO run.

Sequence config (YAML)::

    stages: [es, grpo]           # or [grpo, es]
    total_updates: 20            # T; default: the stage configs' common train.max_steps
    model: demo                  # optional: the starting model (default: stage 1's config)
    es: configs/demo/es.yaml     # an ES run config: a path (relative to the current directory
                                 # or to this file) or a mapping
    grpo: configs/demo/grpo.yaml # a GRPO run config: a path or a mapping

Data: both stages read **one data stream** (:mod:`esreason.es.schedule`: the per-epoch seeded
permutations of the training set, concatenated, read in full batches): stage 1 from prompt 0,
stage 2 from where stage 1 stopped (``train.stream_start`` = stage-1 updates x its B), so stage
2 takes exactly the batches one run of T updates would take next, in the same order (the
paper splits the training budget, not the data). The stages must share task, data_path,
train.split, train.limit and train.seed (an error names the key otherwise). Choices (the
paper is silent): a GRPO stage-2's KL reference is its own starting model (the stage-1 checkpoint), as in any
GRPO run. The stage-2 start is verified by tensor hash: the SHA-256 of stage 1's final
checkpoint must equal the hash stage 2's manifest records for its starting model.

Layout: ``OUT/sequence.json`` (plan, hashes, status), ``OUT/stage1_<m>/`` and
``OUT/stage2_<m>/`` (ordinary ES / GRPO run directories). Rerunning resumes: a finished
stage is skipped, an interrupted one continues from its last checkpoint.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from esreason.config import ConfigError, build, config_mapping, merge, parse_overrides, read_yaml, to_dict
from esreason.errors import UserError
from esreason.experiments.file_keys import SequenceFile, key_names

STAGE_METHODS = ("es", "grpo")
SEQUENCE_FILE = "sequence.json"
TOP_KEYS = key_names(SequenceFile)


@dataclass(frozen=True)
class StagePlan:
    """One stage: ``method`` in {es, grpo}, its config (train.max_steps = ``updates``), its directory name."""

    index: int
    method: str
    updates: int
    config: Any
    dirname: str


@dataclass(frozen=True)
class SequencePlan:
    """A validated composition: stage 2's ``config.model`` is filled in when stage 1 has finished."""

    stages: tuple[StagePlan, StagePlan]
    total_updates: int

    @property
    def name(self) -> str:
        return "_".join(s.method for s in self.stages)


@dataclass(frozen=True)
class StageResult:
    method: str
    run_dir: Path
    updates: int
    start_model: str
    final_checkpoint: Path
    final_sha256: str


@dataclass(frozen=True)
class SequenceResult:
    output: Path
    stages: tuple[StageResult, ...]

    @property
    def final_checkpoint(self) -> Path:
        return self.stages[-1].final_checkpoint


def split_budget(total: int) -> tuple[int, int]:
    """Equal split of T updates over two stages; an odd T gives the extra update to stage 2."""
    if isinstance(total, bool) or not isinstance(total, int) or total < 2:
        raise ConfigError(f"config key 'total_updates': a budget of {total!r} updates cannot be split into "
                          "two stages of at least one update each (need an integer >= 2)")
    first = total // 2
    return first, total - first


def _config_class(method: str) -> type:
    if method == "es":
        from esreason.config import RunConfig

        return RunConfig
    from esreason.grpo.config import GRPORunConfig

    return GRPORunConfig


def plan_sequence(data: Mapping[str, Any], base_dir: Path | None = None) -> SequencePlan:
    """Validate a sequence mapping and build both stage configs (nothing is run)."""
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise ConfigError(f"unknown config key '{unknown[0]}'; known keys: {', '.join(TOP_KEYS)}")
    stages = data.get("stages")
    if not isinstance(stages, (list, tuple)) or len(stages) != 2:
        raise ConfigError(f"config key 'stages': expected two stages, [es, grpo] or [grpo, es]; got {stages!r}")
    for s in stages:
        if s not in STAGE_METHODS:
            raise ConfigError(f"config key 'stages': unknown stage {s!r}; choose from {', '.join(STAGE_METHODS)}")
    if stages[0] == stages[1]:
        raise ConfigError(f"config key 'stages': a composition needs two different methods, got {list(stages)}")
    mappings = {}
    for method in stages:
        if method not in data:
            raise ConfigError(f"config key '{method}': missing the {method} stage's run config (path or mapping)")
        mappings[method] = config_mapping(data[method], method, base_dir, cwd_first=True)
    total = data.get("total_updates")
    if total is None:
        steps = {m: (mappings[m].get("train") or {}).get("max_steps") for m in stages}
        if len(set(steps.values())) != 1 or None in steps.values():
            raise ConfigError("config key 'total_updates': not given and the stage configs do not share one "
                              f"train.max_steps ({steps}); set total_updates")
        total = next(iter(steps.values()))
    budgets = split_budget(total)
    model = data.get("model")
    plans: list[StagePlan] = []
    stream_start = 0  # prompts of the composition's data stream read by the stages before
    for i, (method, updates) in enumerate(zip(stages, budgets)):
        mapping = merge(mappings[method], {"train": {"max_steps": updates, "stream_start": stream_start}})
        if i == 0 and model is not None:
            mapping["model"] = model
        try:
            cfg = build(_config_class(method), mapping)
        except ConfigError as exc:
            raise ConfigError(f"stage {i + 1} ({method}): {exc}") from None
        if plans:
            _check_one_stream(plans[0], method, cfg)
        plans.append(StagePlan(i + 1, method, updates, cfg, f"stage{i + 1}_{method}"))
        stream_start += updates * cfg.train.batch_size
    return SequencePlan((plans[0], plans[1]), total)


STREAM_KEYS = ("task", "data_path", "train.split", "train.limit", "train.seed")


def _check_one_stream(first: StagePlan, method: str, cfg: Any) -> None:
    """Both stages read one data stream: same training set and order seed (B may differ)."""
    for key in STREAM_KEYS:
        a, b = first.config, cfg
        for part in key.split("."):
            a, b = getattr(a, part), getattr(b, part)
        if a != b:
            raise ConfigError(f"config key '{method}.{key}': stage 2 ({method}) has {b!r}, stage 1 "
                              f"({first.method}) has {a!r}; a composition's stages read one data stream")


def load_sequence(path: str | Path | None, overrides: Sequence[str] = (),
                  data: Mapping[str, Any] | None = None) -> SequencePlan:
    """Read a sequence YAML (or use ``data``) and apply ``--set`` overrides (``es.es.sigma=...``)."""
    base_dir = Path(path).resolve().parent if path is not None else None
    raw = dict(data) if data is not None else (read_yaml(path) if path is not None else {})
    over = parse_overrides(overrides)
    for method in STAGE_METHODS:  # stage overrides merge into the stage's mapping, wherever it came from
        if method in over and method in raw:
            raw[method] = merge(config_mapping(raw[method], method, base_dir, cwd_first=True), over.pop(method))
    return plan_sequence(merge(raw, over), base_dir)


def train_method(method: str, config: Any, out: Path, progress: bool) -> tuple[int, Path | None]:
    """Train one ES or GRPO run into ``out`` (resumed when it holds one); (updates done, final checkpoint)."""
    # any trace of a run (metrics.jsonl may be the damaged or deleted file) means: resume it
    resume = any((out / name).exists() for name in ("metrics.jsonl", "config.yaml", "checkpoints"))
    if method == "es":  # a child process on a GPU, so that the stage frees GPU 0 when it ends
        from esreason.experiments.es_stage import train_es

        return train_es(config, out, resume=resume, progress=progress)
    from esreason.experiments.launch import train_grpo  # in-process, or one process per GPU (accelerate)

    return train_grpo(config, out, resume=resume, progress=progress)


def _run_stage(stage: StagePlan, out: Path, progress: bool) -> Path:
    steps, final = train_method(stage.method, stage.config, out, progress)
    if steps != stage.updates or final is None:
        raise UserError(f"stage {stage.index} ({stage.method}) in {out} ran {steps} updates, planned "
                        f"{stage.updates}; check train.epochs and the training set size")
    return Path(final)


def _recorded_start_hash(run_dir: Path) -> str | None:
    from esreason.io.verify import DamagedFile, read_json_object

    try:
        manifest = read_json_object(run_dir / "manifest.json")
    except DamagedFile as exc:
        raise UserError(f"{exc}: cannot check stage 2's starting model") from None
    return (manifest.get("model") or {}).get("sha256_tensors")


def run_sequence(plan: SequencePlan, output: str | Path, *, progress: bool = True) -> SequenceResult:
    """Run both stages into ``output`` (resumable: finished stages are skipped), holding the
    sequence directory's lock; each stage's run takes its own (:mod:`esreason.io.lock`)."""
    from esreason.io.lock import directory_lock

    with directory_lock(output, what="sequence directory"):
        return _run_sequence(plan, Path(output), progress)


def _run_sequence(plan: SequencePlan, out: Path, progress: bool) -> SequenceResult:
    from esreason.io.atomic import atomic_write_json
    from esreason.io.hashing import hash_directory_safetensors

    out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"kind": "esreason-sequence", "stages": [s.method for s in plan.stages],
                              "total_updates": plan.total_updates,
                              "split": [s.updates for s in plan.stages],
                              "budget_rule": "stage 1: T // 2, stage 2: T - T // 2 (equal split)",
                              "data_schedule": "one data stream: stage 2 continues stage 1's batches", "results": []}
    seq_file = out / SEQUENCE_FILE
    from esreason.io.verify import read_rebuildable

    old = read_rebuildable(seq_file, "rewriting it (the stage directories are checked on their own)")
    if old is not None:
        if old.get("stages") != record["stages"] or old.get("split") != record["split"]:
            raise UserError(f"{out} holds a sequence {old.get('stages')} split {old.get('split')}; "
                            f"this one is {record['stages']} split {record['split']}: choose another output")
    atomic_write_json(seq_file, record)
    results: list[StageResult] = []
    start_model = plan.stages[0].config.model
    import dataclasses

    from esreason.config_logging import with_wandb

    for stage in plan.stages:
        # W&B: both stages in one group (the sequence directory's name unless the config or experiment names one)
        cfg = with_wandb(stage.config, group=out.name)
        if results:
            cfg = dataclasses.replace(cfg, model=str(results[-1].final_checkpoint.resolve()))
        stage = dataclasses.replace(stage, config=cfg)
        run_dir = out / stage.dirname
        final = _run_stage(stage, run_dir, progress)
        if results:
            recorded = _recorded_start_hash(run_dir)
            if recorded != results[-1].final_sha256:
                raise UserError(f"stage {stage.index} in {run_dir} did not start from stage {stage.index - 1}'s "
                                f"final checkpoint (tensor hash {recorded} != {results[-1].final_sha256})")
        results.append(StageResult(stage.method, run_dir, stage.updates, str(cfg.model), final,
                                   hash_directory_safetensors(final)))
        record["results"] = [{"stage": i + 1, "method": r.method, "run_dir": r.run_dir.name, "updates": r.updates,
                              "start_model": r.start_model, "final_checkpoint": str(r.final_checkpoint),
                              "final_sha256": r.final_sha256} for i, r in enumerate(results)]
        if len(results) == 2:
            record["stage2_start_matches_stage1_final"] = True
        record["start_model"] = start_model
        atomic_write_json(seq_file, record)
    return SequenceResult(out, tuple(results))


def stage_configs_dict(plan: SequencePlan) -> list[dict[str, Any]]:
    return [{"method": s.method, "updates": s.updates, "config": to_dict(s.config)} for s in plan.stages]


# --------------------------------------------------------------------------- CLI


def _cmd_train_sequence(args: argparse.Namespace) -> int:
    from esreason.config_logging import wandb_sets

    plan = load_sequence(args.config, [*(args.set or []), *wandb_sets(args, ("es.", "grpo."))])
    output = Path(args.output) if args.output else Path("runs") / (Path(args.config).stem if args.config
                                                                    else plan.name)
    print(f"sequence {' -> '.join(s.method.upper() for s in plan.stages)}: {plan.total_updates} updates "
          f"split {plan.stages[0].updates} + {plan.stages[1].updates}")
    result = run_sequence(plan, output, progress=not args.no_progress)
    for r in result.stages:
        print(f"  {r.method}: {r.updates} updates -> {r.final_checkpoint}")
    print(f"final checkpoint: {result.final_checkpoint}")
    print(f"run directory: {output}")
    return 0


def register(train_subparsers: Any) -> argparse.ArgumentParser:
    """Add ``sequence`` to the ``esreason train`` sub-commands."""
    p = train_subparsers.add_parser(
        "sequence", help="ES->GRPO or GRPO->ES under one update budget (paper §'Sequentially Mixed Training')")
    p.add_argument("--config", required=True, help="sequence YAML (stages, total_updates, es, grpo)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a key, e.g. --set total_updates=10 or --set es.es.sigma=1e-3 (repeatable)")
    p.add_argument("--output", help="sequence directory (default: runs/<config name>); rerun to resume")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    from esreason.config_logging import add_wandb_flag

    add_wandb_flag(p)
    p.set_defaults(func=_cmd_train_sequence)
    return p
