"""Write this example's data: 4-digit additions in which every column carries (e.g. 5678+4567).

    python make_data.py            # -> data/train.jsonl (2,000 rows), data/test.jsonl (200 rows)

Each row: {"a": 5678, "b": 4567, "total": 10245}. Test pairs never occur in train. The files are
committed (a fresh clone runs every command of docs/custom-tasks.md as it is); this script re-creates
them byte for byte (tests/test_custom_task_docs.py checks it), and is the place to change the data.
"""

import json
import random
from pathlib import Path


def carries_everywhere(a: int, b: int) -> bool:
    carry = 0
    for x, y in zip(str(a)[::-1], str(b)[::-1]):
        carry = 1 if int(x) + int(y) + carry >= 10 else 0
        if not carry:
            return False
    return True


def main(out: Path = Path(__file__).parent / "data", train: int = 2000, test: int = 200, seed: int = 0) -> None:
    rng, seen, rows = random.Random(seed), set(), []
    while len(rows) < train + test:
        a, b = rng.randint(1000, 9999), rng.randint(1000, 9999)
        if (a, b) not in seen and carries_everywhere(a, b):
            seen.add((a, b))
            rows.append({"a": a, "b": b, "total": a + b})
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("test", rows[:test]), ("train", rows[test:])):
        with open(out / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in part)
    print(f"wrote {train} train and {test} test rows to {out}")


if __name__ == "__main__":
    main()
