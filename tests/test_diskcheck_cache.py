"""The launch disk check counts what lands in the Hugging Face caches and the evaluation outputs
(esreason.experiments.diskcache): a hub model's weights until the hub cache holds it, each paper
dataset's files and Arrow copy until cached, and every evaluation's responses.jsonl under --output.
No network: the caches are empty or hand-made directories under the test's temp dir.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from esreason.errors import UserError
from esreason.experiments import diskcache, diskcheck
from esreason.experiments.spec import load_spec
from esreason.io.architectures import architecture, parameter_count

ROOT = Path(__file__).resolve().parents[1]
EASY = ROOT / "configs" / "experiments" / "easy.yaml"
MODEL = "Qwen/Qwen2.5-1.5B-Instruct"


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    return home


def _put(home: Path, kind: str, repo: str, name: str) -> None:
    path = home / "hub" / f"{kind}s--{repo.replace('/', '--')}" / "snapshots" / "0123abcd" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")


def test_the_cache_locations_follow_huggingface_hub_and_datasets(tmp_path):
    assert diskcache.hub_cache({"HF_HOME": "/h"}) == Path("/h/hub")
    assert diskcache.hub_cache({"HF_HOME": "/h", "HF_HUB_CACHE": "/c"}) == Path("/c")
    assert diskcache.hub_cache({"HUGGINGFACE_HUB_CACHE": "/old"}) == Path("/old")
    assert diskcache.hub_cache({"XDG_CACHE_HOME": "/x"}) == Path("/x/huggingface/hub")
    assert diskcache.datasets_cache({"HF_HOME": "/h"}) == Path("/h/datasets")
    assert diskcache.datasets_cache({"HF_HOME": "/h", "HF_DATASETS_CACHE": "/d"}) == Path("/d")


def test_a_model_not_downloaded_counts_its_published_weights(hf_home):
    spec = load_spec(EASY)
    weights = parameter_count(architecture(MODEL)) * 2  # its config.json says bfloat16
    assert diskcache.model_download_bytes(spec) == {MODEL: weights}
    before = diskcheck.planned_disk_bytes(spec)["hub_downloads"]
    _put(hf_home, "model", MODEL, "model.safetensors")  # downloaded: nothing left to fetch
    assert diskcache.model_download_bytes(spec) == {}
    assert before - diskcheck.planned_disk_bytes(spec)["hub_downloads"] == weights > 3e9


def test_a_dataset_not_downloaded_counts_its_files_and_arrow_copy(hf_home):
    spec = load_spec(EASY)
    fetch = diskcache.dataset_download_bytes(spec)
    assert "openai/gsm8k" in fetch  # the training task (and its test split for evaluation)
    down, arrow = fetch["openai/gsm8k"]
    assert down == diskcache.DATASET_MIB["openai/gsm8k"] * diskcache.MIB and arrow == diskcache.ARROW_FACTOR * down
    need = diskcheck.planned_disk_bytes(spec)
    assert need["datasets_arrow"] == sum(a for _, a in fetch.values())
    _put(hf_home, "dataset", "openai/gsm8k", "main/train-00000-of-00001.parquet")
    assert "openai/gsm8k" not in diskcache.dataset_download_bytes(spec)
    assert need["hub_downloads"] - diskcheck.planned_disk_bytes(spec)["hub_downloads"] == down


def test_a_local_copy_of_a_dataset_is_not_downloaded(hf_home, tmp_path):
    data = tmp_path / "data"
    (data / "gsm8k").mkdir(parents=True)
    spec = load_spec(EASY, [f"data_dir={data}"])
    assert "openai/gsm8k" not in diskcache.dataset_download_bytes(spec)


def test_evaluation_outputs_scale_with_problems_samples_and_evaluated_models(hf_home):
    small = load_spec(EASY, ["eval.limit=10", "eval.samples=4", "eval.ks=[1,4]", "eval.greedy=false"])
    more = load_spec(EASY, ["eval.limit=10", "eval.samples=8", "eval.ks=[1,4]", "eval.greedy=false"])
    a, b = diskcache.eval_output_bytes(small), diskcache.eval_output_bytes(more)
    assert a > 0 and b == pytest.approx(2 * a, rel=1e-6)
    from esreason.experiments.spec import run_stages

    evaluations = sum(1 for _n, kind, _u in run_stages(small) if kind == "eval")
    tokens = min(250, small.eval.max_new_tokens)  # the plan's mean Instruct response, capped
    per = diskcache.RECORD_BYTES + diskcache.BYTES_PER_TOKEN * tokens
    assert a == int(evaluations * 10 * len(small.eval.tasks) * 4 * per)


def test_the_check_names_the_hub_cache_when_downloads_do_not_fit(hf_home, tmp_path):
    spec = load_spec(EASY)
    need = diskcheck.planned_disk_bytes(spec)
    out, engines = tmp_path / "exp", tmp_path / "engines"
    engines.mkdir()
    total = sum(need.values())  # one file system for all four places
    with pytest.raises(UserError) as exc:
        diskcheck.check_disk(spec, out, engines, free=lambda p: total - 1)
    msg = str(exc.value)
    assert f"model and dataset downloads (HF_HUB_CACHE) under {hf_home / 'hub'}: {need['hub_downloads']:,} bytes" in msg
    assert f"datasets' Arrow copies (HF_DATASETS_CACHE) under {hf_home / 'datasets'}" in msg and "HF_HOME=DIR" in msg
    diskcheck.check_disk(spec, out, engines, free=lambda p: total)
