"""ES on a task of your own through the Python API: the run `esreason train es --config es.yaml --tasks-dir .`
makes (run_cli.sh), with the same checkpoints. Run it here: cd examples/custom_task && python train.py"""

import json

from datasets import load_dataset

from esreason import ESConfig, ESTrainer, evaluate
from reward import digit_reward, final_answer

SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."

data = load_dataset("json", data_files={"train": "data/train.jsonl", "test": "data/test.jsonl"})
data = data.map(lambda r: {"prompt": [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": f"{r['a']}+{r['b']}"}]})
args = ESConfig(output_dir="runs/mine", task="carry-add", population_size=16, sigma=2e-3, alpha=1e-3,
                batch_size=16, max_steps=10, checkpoint_every=5, max_new_tokens=64)
trainer = ESTrainer(model="demo", reward_funcs=digit_reward, train_dataset=data["train"], args=args)
result = trainer.train()             # runs/mine: config.yaml, manifest.json, metrics.jsonl, checkpoints/step_5, step_10
trainer.save_model("runs/mine/model")  # loads with AutoModelForCausalLM.from_pretrained
scores = evaluate(result.final_checkpoint, data["test"].select(range(64)), reward_funcs=digit_reward,
                  answer_fn=final_answer, n=8, k=[1, 8], max_new_tokens=64)
print(json.dumps({k: round(scores[k], 3) for k in ("pass@1", "pass@8", "maj@8")}))
