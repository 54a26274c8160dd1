"""ES on a task of your own through the Python API (the same run as run_cli.sh's `train es`)."""

import json
import sys
from pathlib import Path

from datasets import load_dataset

from esreason import ESConfig, ESTrainer, evaluate

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from reward import digit_reward, final_answer  # noqa: E402

SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."


def to_prompt(row):
    return {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{row['a']}+{row['b']}"}]}


data = load_dataset("json", data_files={s: str(HERE / f"data/{s}.jsonl") for s in ("train", "test")})
data = data.map(to_prompt)
out = sys.argv[1] if len(sys.argv) > 1 else "runs/custom-api"
args = ESConfig(output_dir=out, task="carry-add", population_size=16, sigma=2e-3, alpha=1e-3, batch_size=16,
                max_steps=10, checkpoint_every=5, max_new_tokens=64)
trainer = ESTrainer(model="demo", reward_funcs=digit_reward, train_dataset=data["train"], args=args)
result = trainer.train()
scores = evaluate(result.final_checkpoint, data["test"].select(range(64)), reward_funcs=digit_reward,
                  answer_fn=final_answer, n=8, k=[1, 8], max_new_tokens=64)
print(json.dumps({k: scores[k] for k in ("pass@1", "pass@8", "maj@8")}))
