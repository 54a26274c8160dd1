"""theta_0 of anchored ES (``es.anchor_decay``, :mod:`esreason.es.anchor`) across a run's life.

theta_0 is the run's *start* model: the weights the first update started from, not the checkpoint a
resumed run is loaded from. So the run keeps it on disk once, in its own directory::

    RUN/anchor/es_anchor/anchor.safetensors   theta_0 in the model dtype (unique tensors, HF names;
                                              the relative path every anchor file has: hf.ANCHOR_FILE)
    RUN/anchor/COMPLETE                       sha256 of that file (written last; verified on every resume)

- A run that starts at step 0 writes it from its freshly loaded policy (the policy snapshots theta_0
  when it is built). Disk: one copy of the weights in the model dtype (1.5B in bf16: 3.1 GB), once
  per run, never per checkpoint.
- A resumed run reads it back into the policy (tensor by tensor), so every later update pulls
  toward the same theta_0 as the uninterrupted run did: the two end bit-identical.
- The Ray pool's engines get it beside their start state (:func:`esreason.backends.engine.policy_state`
  adds ``es_anchor/anchor.safetensors``), also when an engine is replaced or re-loaded.

For a composition stage (ES after GRPO) theta_0 is that stage's start: the GRPO checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from esreason.errors import UserError

#: The run directory's copy of theta_0 (a checkpoint-like directory with a COMPLETE checksum marker).
ANCHOR_DIR = "anchor"


def keep_run_anchor(run: str | Path, policy: Any, start_step: int) -> Path | None:
    """Write (start_step 0) or load (a resumed run) ``RUN/anchor``; None when anchored ES is off.

    UserError naming the directory when a resumed anchored run has no intact copy of its start weights.
    """
    if policy.params.anchor_state() is None:
        return None
    from esreason.io.atomic import atomic_directory
    from esreason.io.verify import DamagedFile, checksum_manifest, verify_checkpoint

    target = Path(run) / ANCHOR_DIR
    if start_step == 0:
        with atomic_directory(target, marker_text=checksum_manifest) as tmp:
            policy.save_anchor(tmp)
        return target
    try:
        verify_checkpoint(target)
    except DamagedFile as exc:
        raise UserError(f"cannot resume an anchored ES run (es.anchor_decay > 0) without its start weights: "
                        f"{exc}") from None
    policy.load_anchor(target)
    return target
