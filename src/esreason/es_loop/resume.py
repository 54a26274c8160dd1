"""What ``--resume`` may continue: the run's saved config, damaged header files, longer runs.

Shared by ES and GRPO runs (docs/faults.md):

- The run's config is stored twice, in ``config.yaml`` and in ``manifest.json`` ("config").
  A copy that cannot be read, or that differs where the other copy matches this invocation,
  is damaged: the run continues with a one-line warning and the copy is rewritten. When
  neither copy can be read the resume is refused with one line naming ``config.yaml``.
- Raising ``train.max_steps`` (or ``train.epochs`` when neither config sets max_steps) is a
  *longer run*: every random draw is a function of (train.seed, step) and the data order of
  (train.seed, epoch), so continuing gives the weights of a run started with the larger value.
  Any other difference is refused, as before, with the first differing keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from esreason.config import to_dict
from esreason.config_logging import without_logging
from esreason.errors import UserError
from esreason.io.manifest import MANIFEST_FILE
from esreason.io.verify import DamagedFile, read_json_object, read_yaml_mapping, warn

CONFIG_FILE = "config.yaml"
#: Keys a resumed run may raise (dotted): the schedule's length only.
EXTENDABLE = ("train.max_steps", "train.epochs")


@dataclass(frozen=True)
class ResumeCheck:
    """Outcome of :func:`check_resume_config`.

    rewrite_config: config.yaml must be (re)written from the current config.
    rewrite_manifest: manifest.json is missing or damaged and must be rebuilt.
    extended: the dotted keys raised for a longer run, as {key: [old, new]}.
    """

    rewrite_config: bool = False
    rewrite_manifest: bool = False
    extended: dict[str, list[Any]] = field(default_factory=dict)


def diff_config(a: Any, b: Any, prefix: str = "") -> list[str]:
    """``key: old -> new`` for every dotted key where ``a`` and ``b`` differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += diff_config(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else k)
        return out
    return [] if a == b else [f"{prefix}: {a!r} -> {b!r}"]


def _train(d: dict[str, Any]) -> dict[str, Any]:
    t = d.get("train")
    return t if isinstance(t, dict) else {}


def extension(saved: dict[str, Any], now: dict[str, Any]) -> dict[str, list[Any]] | None:
    """{key: [old, new]} when ``now`` only raises the run's length over ``saved``; {} when equal; None otherwise.
    The ``logging`` section is not compared (:func:`esreason.config_logging.without_logging`)."""
    saved, now = without_logging(saved), without_logging(now)
    if saved == now:
        return {}
    st, nt = _train(saved), _train(now)
    rest_saved = {**saved, "train": {k: v for k, v in st.items() if k not in ("max_steps", "epochs")}}
    rest_now = {**now, "train": {k: v for k, v in nt.items() if k not in ("max_steps", "epochs")}}
    if rest_saved != rest_now:
        return None
    changed: dict[str, list[Any]] = {}
    old_max, new_max = st.get("max_steps"), nt.get("max_steps")
    if old_max != new_max:
        if not (isinstance(old_max, int) and isinstance(new_max, int) and new_max > old_max):
            return None
        changed["train.max_steps"] = [old_max, new_max]
    if st.get("epochs") != nt.get("epochs"):
        old_ep, new_ep = st.get("epochs"), nt.get("epochs")
        epoch_based = old_max is None and new_max is None
        if not (epoch_based and isinstance(old_ep, int) and isinstance(new_ep, int) and new_ep > old_ep):
            return None
        changed["train.epochs"] = [old_ep, new_ep]
    return changed


def _manifest_config(run_path: Path) -> tuple[dict[str, Any] | None, DamagedFile | None]:
    try:
        manifest = read_json_object(run_path / MANIFEST_FILE)
    except DamagedFile as exc:
        return None, exc
    cfg = manifest.get("config")
    if not isinstance(cfg, dict):
        return None, DamagedFile(run_path / MANIFEST_FILE, "no 'config' object")
    return cfg, None


def check_resume_config(run_path: str | Path, cfg: Any) -> ResumeCheck:
    """Compare ``cfg`` with the run's saved config (config.yaml, else manifest.json); see the module doc.

    UserError when the config differs other than by a longer schedule, or when no saved copy
    can be read but the run has one.
    """
    run_path = Path(run_path)
    now = to_dict(cfg)
    cfg_path = run_path / CONFIG_FILE
    manifest_cfg, manifest_bad = _manifest_config(run_path)
    rewrite_manifest = manifest_bad is not None
    if manifest_bad is not None and ((run_path / MANIFEST_FILE).exists() or cfg_path.exists()):
        warn(f"{manifest_bad}; rebuilding {MANIFEST_FILE}")
    if not cfg_path.exists() and manifest_cfg is None:
        return ResumeCheck(rewrite_config=True, rewrite_manifest=rewrite_manifest)  # nothing saved yet
    try:
        saved: dict[str, Any] | None = read_yaml_mapping(cfg_path)
        cfg_bad: DamagedFile | None = None
    except DamagedFile as exc:
        saved, cfg_bad = None, exc
    if saved is not None:
        ext = extension(saved, now)
        if ext is not None:
            return ResumeCheck(rewrite_config=bool(ext), rewrite_manifest=rewrite_manifest, extended=ext)
        if manifest_cfg is None or extension(manifest_cfg, now) is None:
            diffs = diff_config(saved, now)
            raise UserError(f"--resume with a different config than {cfg_path}: " + "; ".join(diffs[:5])
                            + f" (only {' or '.join(EXTENDABLE)} may be raised)")
        cfg_bad = DamagedFile(cfg_path, f"differs from the config in {MANIFEST_FILE}, which matches this run")
    if manifest_cfg is None:
        raise UserError(f"cannot resume: {cfg_bad} and {manifest_bad}")
    ext = extension(manifest_cfg, now)
    if ext is None:
        diffs = diff_config(manifest_cfg, now)
        raise UserError(f"{cfg_bad}; the config in {run_path / MANIFEST_FILE} differs from this run's: "
                        + "; ".join(diffs[:5]))
    warn(f"{cfg_bad}; using the config recorded in {MANIFEST_FILE} and rewriting {CONFIG_FILE}")
    return ResumeCheck(rewrite_config=True, rewrite_manifest=rewrite_manifest, extended=ext)


def trained_evidence(run_path: str | Path, extra: tuple[str, ...] = ()) -> str | None:
    """What in ``run_path`` shows that a run has trained there, or None when nothing has.

    A run *holds* a directory from its first update on: a metrics row of an update (step >= 1) or
    a complete checkpoint, or an entry of ``extra`` (GRPO: TRL's ``trl/checkpoint-*``) that exists.
    The header files written before the first update (config.yaml, manifest.json, backend.json, an
    empty metrics.jsonl or one with only the step-0 held-out row, tensorboard/) are not a run: a
    command that failed before its first update (a raising reward function, a backend that did not
    start) can be rerun as it was started, and the rerun replaces them. This rule needs no cleanup
    on failure, so it holds after a kill or a power cut too. A metrics file that cannot be read counts
    as a run (it is not ours to discard).
    """
    from esreason.io import RunDir, read_metrics

    run_dir = RunDir(run_path)
    found = run_dir.latest_checkpoint()
    if found is not None:
        return f"checkpoint {found[1].name}"
    try:
        rows = read_metrics(run_dir.metrics_path)
    except UserError:
        return run_dir.metrics_path.name
    updates = [r["step"] for r in rows if r["step"] >= 1]
    if updates:
        return f"{run_dir.metrics_path.name} rows up to update {max(updates)}"
    for pattern in extra:
        hit = sorted(Path(run_path).glob(pattern))
        if hit:
            return str(hit[0].relative_to(run_path))
    return None


def record_extension(run_path: Path, cfg: Any, check: ResumeCheck, start_step: int) -> None:
    """After a longer-run resume: update manifest.json's config and note the extension in it."""
    from esreason.io.atomic import atomic_write_json

    if not check.extended or check.rewrite_manifest:
        return  # nothing raised, or the manifest is rebuilt by the caller
    manifest = read_json_object(run_path / MANIFEST_FILE)
    manifest["config"] = to_dict(cfg)
    manifest.setdefault("extended", []).append({"at_step": start_step, "keys": check.extended})
    atomic_write_json(run_path / MANIFEST_FILE, manifest)


__all__ = ["CONFIG_FILE", "EXTENDABLE", "ResumeCheck", "check_resume_config", "diff_config", "extension",
           "record_extension", "trained_evidence"]
