"""One training seed of a multi-seed experiment as a single-seed experiment (no retraining).

    python scripts/seed_subset.py EXP SEED OUT && esreason report OUT

Writes ``OUT/experiment.json``: the record of EXP without ``seeds``, every trained method's
entry replaced by its seed SEED entry (eval directory, checkpoint, training stages), paths
pointing into EXP. Same config and same seed give the same run (docs/DESIGN "Same config + same
seed => same run"), so the seed-0 subset of ``esreason demo --seeds 3`` is the one-seed
``esreason demo``'s experiment: its report gives the one-seed verdicts without a second demo.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any


def _rel(path: str | None, exp: Path, out: Path) -> str | None:
    return None if path is None else os.path.relpath(exp / path, out)


def subset(exp: Path, seed: str, out: Path) -> dict[str, Any]:
    record = json.loads((exp / "experiment.json").read_text())
    record.pop("seeds", None)
    methods = {}
    for key, m in record["methods"].items():
        entry = {k: v for k, v in m.items() if k != "seeds"}
        if m.get("seeds"):
            if seed not in m["seeds"]:
                raise SystemExit(f"{key} has no seed {seed} in {exp}")
            entry.update(m["seeds"][seed])
        entry["eval"] = _rel(entry.get("eval"), exp, out)
        entry["training"] = [{**st, "metrics": _rel(st.get("metrics"), exp, out)} for st in entry.get("training", [])]
        methods[key] = entry
    record["methods"] = methods
    record["name"] = f"{record.get('name', 'experiment')}-seed{seed}"
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("experiment", type=Path)
    ap.add_argument("seed")
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "experiment.json").write_text(json.dumps(subset(args.experiment, args.seed, args.out), indent=1))
    print(args.out / "experiment.json")


if __name__ == "__main__":
    main()
