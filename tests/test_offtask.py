"""Off-task drift: the token KL scorer, the analysis.offtask settings and sets, and the report's section 9.

An experiment run end to end with ``analysis.offtask`` is in tests/test_offtask_run.py (heavy).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from esreason.config import ConfigError
from esreason.errors import UserError


def _models(tiny_model_dir):
    from esreason.backends.hf import load_model

    base, tok = load_model(str(tiny_model_dir))
    tuned, _ = load_model(str(tiny_model_dir))
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in tuned.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return base, tuned, tok


def _reference_kl(base, tuned, prompt, response) -> float:
    """KL(base || tuned) summed over the response positions, one unpadded row at a time, float64."""
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        lb = torch.log_softmax(base(ids).logits[0].double(), -1)
        lt = torch.log_softmax(tuned(ids).logits[0].double(), -1)
    lo, hi = len(prompt) - 1, len(prompt) + len(response) - 1
    return float((lb[lo:hi].exp() * (lb[lo:hi] - lt[lo:hi])).sum())


def test_token_kl_matches_a_per_row_reference_and_is_base_given_tuned(tiny_model_dir):
    from esreason.backends.kl_scoring import TokenKLScorer

    base, tuned, tok = _models(tiny_model_dir)
    prompts = [tok(t, add_special_tokens=True)["input_ids"] for t in ("Q:12+7 A:", "3,4,5->", "x")]
    responses = [tok("1+7=8 \\boxed{19}", add_special_tokens=False)["input_ids"],
                 tok("<answer>3*4+5</answer>", add_special_tokens=False)["input_ids"], []]
    got = TokenKLScorer(base, tuned, tokens_per_forward=40, slice_tokens=3).kl_sums(prompts, responses)
    # padding, packing and slicing change only float32 summation order: 1e-4 relative is ~100x that
    for (kl, n), p, r in zip(got, prompts, responses):
        assert n == len(r)
        assert kl == pytest.approx(_reference_kl(base, tuned, p, r), rel=1e-4, abs=1e-7)
    assert got[2] == (0.0, 0) and got[0][0] > 0 and got[1][0] > 0
    reverse = TokenKLScorer(tuned, base).kl_sums(prompts[:1], responses[:1])[0][0]
    assert reverse == pytest.approx(_reference_kl(tuned, base, prompts[0], responses[0]), rel=1e-4)
    assert abs(reverse - got[0][0]) > 1e-3 * got[0][0]  # the direction matters: KL is not symmetric
    same = TokenKLScorer(base, base).kl_sums(prompts, responses)
    assert all(abs(kl) < 1e-6 for kl, _ in same)  # a model against itself: 0 up to float32 rounding


def test_relative_l2_is_the_papers_definition(tiny_model_dir):
    from esreason.backends.kl_scoring import relative_l2
    from esreason.es.params import unique_named_parameters

    base, tuned, _ = _models(tiny_model_dir)
    a = torch.cat([p.detach().double().flatten() for _, p in unique_named_parameters(base)])
    b = torch.cat([p.detach().double().flatten() for _, p in unique_named_parameters(tuned)])
    assert relative_l2(base, tuned) == pytest.approx(float((b - a).norm() / a.norm()), rel=1e-12)
    assert relative_l2(base, base) == 0.0


@pytest.mark.parametrize("offtask, needle", [
    ({}, "exactly one of task, file, dataset"),
    ({"task": "demo-countdown", "dataset": "wikitext"}, "exactly one of"),
    ({"task": "no-such-task"}, "analysis.offtask.task': unknown task"),
    ({"file": "/no/such/file.jsonl"}, "analysis.offtask.file'.*does not exist"),
    ({"task": "demo-countdown", "limit": 0}, "analysis.offtask.limit"),
    ({"task": "demo-countdown", "temperature": 0}, "analysis.offtask.temperature"),
    ({"task": "demo-countdown", "lenght": 3}, "unknown config key 'analysis.offtask.lenght'"),
])
def test_bad_offtask_settings_name_the_key(offtask, needle):
    from esreason.analysis.offtask.settings import parse_analysis

    with pytest.raises(ConfigError, match=needle):
        parse_analysis({"offtask": offtask})
    with pytest.raises(ConfigError, match="unknown config key 'analysis.drift'"):
        parse_analysis({"drift": {}})


def test_experiment_spec_takes_the_analysis_key(tmp_path):
    from esreason.experiments.spec import parse_spec

    (tmp_path / "text.txt").write_text("one line\n\nanother line\n")
    data = {"name": "t", "model": "demo", "task": "demo-add", "methods": ["base"],
            "eval": {"in_domain": ["demo-add"], "held_out": ["demo-sub"], "samples": 2, "ks": [1, 2]},
            "analysis": {"offtask": {"file": "text.txt", "limit": 5}}}
    spec = parse_spec(data, tmp_path)
    assert spec.analysis.offtask.file == str(tmp_path / "text.txt") and spec.analysis.offtask.limit == 5
    assert parse_spec({**data, "analysis": None}).analysis.offtask is None


def test_file_sources_and_their_errors(tiny_model_dir, tmp_path):
    from esreason.analysis.offtask.data import build_rows, load_set, save_set, settings_record
    from esreason.analysis.offtask.settings import OfftaskSettings
    from esreason.backends.hf import load_model

    _, tok = load_model(str(tiny_model_dir))
    jl = tmp_path / "t.jsonl"
    jl.write_text(json.dumps({"text": "abcdefgh"}) + "\n\n" + json.dumps({"prompt": "Q:", "response": "xyz"}) + "\n"
                  + json.dumps({"text": "   "}) + "\n")
    s = OfftaskSettings(file=str(jl), max_tokens=4)
    rows = build_rows(s, None, tok)
    first = tok("abcdefgh", add_special_tokens=True)["input_ids"]
    assert [r.id for r in rows] == ["line1", "line3"]  # the blank text is skipped
    assert rows[0].prompt_ids == tuple(first[:1]) and rows[0].response_ids == tuple(first[1:5])
    assert rows[1].response_ids == tuple(tok("xyz", add_special_tokens=False)["input_ids"])
    txt = tmp_path / "t.txt"
    txt.write_text("first text\n\nsecond\nthird\n")
    assert [r.id for r in build_rows(OfftaskSettings(file=str(txt), limit=2), None, tok)] == ["line1", "line3"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "ok"}) + "\n{not json\n")
    with pytest.raises(UserError, match=r"bad.jsonl:2: not JSON"):
        build_rows(OfftaskSettings(file=str(bad)), None, tok)
    (tmp_path / "wrong.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(UserError, match=r"wrong.jsonl:1: expected an object with 'text'"):
        build_rows(OfftaskSettings(file=str(tmp_path / "wrong.jsonl")), None, tok)
    # stored once, reused only for the same settings and intact bytes
    record = settings_record(s, "demo")
    meta = save_set(tmp_path / "set", rows, record)
    assert meta["rows"] == 2 and meta["tokens"] == sum(len(r.response_ids) for r in rows)
    assert load_set(tmp_path / "set", record)[0] == rows
    assert load_set(tmp_path / "set", settings_record(OfftaskSettings(file=str(jl), max_tokens=5), "demo")) is None
    (tmp_path / "set" / "set.jsonl").write_text("")
    assert load_set(tmp_path / "set", record) is None


def test_base_samples_end_with_their_stop_token(tiny_model_dir):
    from esreason.analysis.offtask.data import build_rows
    from esreason.analysis.offtask.settings import OfftaskSettings
    from esreason.backends.hf import load_model

    model, tok = load_model(str(tiny_model_dir))
    rows = build_rows(OfftaskSettings(task="demo-countdown", limit=6, max_tokens=12, seed=3), model, tok)
    assert len(rows) == 6 and all(1 <= len(r.response_ids) <= 13 for r in rows)
    again = build_rows(OfftaskSettings(task="demo-countdown", limit=6, max_tokens=12, seed=3), model, tok)
    assert again == rows  # seeded
    eos = set(tok.convert_tokens_to_ids([tok.eos_token]))
    # a row of 13 tokens stopped at its 13th (the stop token is scored); shorter rows all end with it
    assert all(r.response_ids[-1] in eos for r in rows if len(r.response_ids) < 12)


# ---------------------------------------------------------------------- the report's section 9

KL = {"grpo": 0.02, "es": 0.08, "es_grpo": 0.09, "grpo_es": 0.05}


def _write_offtask(root: Path, methods) -> dict:
    index = {"set": "offtask/set.json", "direction": "KL(base || tuned)", "rows": 10, "tokens": 200,
             "source": "task", "methods": {}}
    for m in methods:
        rows = [{"id": f"r{i}", "kl_sum": 20 * (KL[m] + 0.01 * (1 if i % 2 else -1)), "tokens": 20} for i in range(10)]
        (root / "offtask").mkdir(exist_ok=True)
        (root / "offtask" / f"{m}.json").write_text(json.dumps({"rows": rows, "relative_l2": 0.001 * (1 + len(m))}))
        index["methods"][m] = {"file": f"offtask/{m}.json"}
    record = json.loads((root / "experiment.json").read_text())
    record["offtask"] = index
    (root / "experiment.json").write_text(json.dumps(record))
    return index


def test_report_has_the_gain_vs_forgetting_table_and_figure(tmp_path):
    from esreason.report import build_report
    from test_report import _png_size, write_experiment

    root = write_experiment(tmp_path / "exp")
    _write_offtask(root, ["grpo", "es", "es_grpo"])  # GRPO->ES has none: noted, its KL cell empty
    result = build_report(root)
    table = json.loads(result.json_path.read_text())["tables"]["offtask_drift"]
    es = table["rows"]["es"]
    assert es["in_domain_gain_pass@1"]["value"] == pytest.approx(0.10)  # 60 - 50 on demo-add
    assert es["heldout_change_pass@1"]["value"] == pytest.approx(0.02)  # (2 + 2) / 2 over demo-sub, countdown
    kl = es["offtask_kl_per_token"]
    assert kl["value"] == pytest.approx(0.08) and kl["ci_low"] < 0.08 < kl["ci_high"] and kl["n"] == 10
    # +-0.01 around 0.08 over 10 rows: the bootstrap mean's 95% interval lies within 0.08 +- 0.0065
    assert 0.08 - 0.0066 < kl["ci_low"] and kl["ci_high"] < 0.08 + 0.0066
    seq = es["offtask_kl_per_sequence"]  # every row 20 tokens: 20 x the per-token figure, interval too
    assert seq["value"] == pytest.approx(1.6) and seq["ci_low"] < 1.6 < seq["ci_high"] and seq["n"] == 10
    assert es["relative_l2"] == pytest.approx(0.003)
    assert table["rows"]["grpo_es"]["offtask_kl_per_token"] is None and table["kl_direction"] == "KL(base || tuned)"
    assert table["rows"]["grpo_es"]["offtask_kl_per_sequence"] is None
    assert any("GRPO→ES: no off-task KL" in n for n in result.notes)
    md = result.markdown.read_text()
    assert "## 9. Gain vs forgetting" in md and "![gain vs forgetting](gain_vs_forgetting.png)" in md
    assert "| ES | +10.0 [" in md and "| 1.600 [1.4" in md and "| 0.0800 [0.07" in md
    assert "Off-task KL per sequence (nats/response) | Off-task KL per token (nats/token)" in md
    assert (result.out_dir / "offtask_drift.tex").read_text().startswith("% requires")
    w, h = _png_size(result.out_dir / "gain_vs_forgetting.png")
    assert w > 600 and h > 300


def test_without_offtask_files_the_table_still_has_gain_and_retention(tmp_path):
    from esreason.report import build_report
    from test_report import write_experiment

    result = build_report(write_experiment(tmp_path / "exp", ["base", "grpo", "es"]))
    rows = json.loads(result.json_path.read_text())["tables"]["offtask_drift"]["rows"]
    assert rows["grpo"]["in_domain_gain_pass@1"]["value"] == pytest.approx(0.20)
    assert rows["grpo"]["offtask_kl_per_token"] is None and rows["grpo"]["offtask_kl_per_sequence"] is None
    assert any("names no analysis.offtask" in n for n in result.notes)
    assert (result.out_dir / "gain_vs_forgetting.png").is_file()  # the held-out panel alone


def test_per_sequence_and_per_token_kl_differ_where_lengths_do(tmp_path):
    """Two rows whose token KLs sum to 0.2, over 2 and over 10 tokens: each estimates a sequence KL of 0.2;
    the length-normalised per-token figure is (0.1 + 0.02) / 2 = 0.06."""
    from esreason.report.drift import _read_run

    path = tmp_path / "m.json"
    path.write_text(json.dumps({"rows": [{"id": "a", "kl_sum": 0.2, "tokens": 2},
                                         {"id": "b", "kl_sum": 0.2, "tokens": 10}], "relative_l2": 0.0}))
    run = _read_run(path)
    assert np.mean(list(run.per_sequence.values())) == pytest.approx(0.2)
    assert np.mean(list(run.per_token.values())) == pytest.approx(0.06)


def test_kl_interval_with_seeds_is_the_seed_level_t_interval():
    from esreason.report.drift import kl_cell

    rng = np.random.default_rng(0)
    runs = [{f"r{i}": 0.05 + 0.01 * s + 0.002 * rng.standard_normal() for i in range(20)} for s in range(3)]
    cell = kl_cell(runs, 0.95, 0)
    assert cell.value == pytest.approx(np.mean([list(r.values()) for r in runs]))
    assert cell.estimate.kind == "t" and cell.estimate.label.startswith("3 training seeds")
    assert cell.low < cell.value < cell.high and cell.high - cell.low > 0.02  # the seeds' 0.01 steps dominate
    one = kl_cell(runs[:1], 0.95, 0)
    assert one.estimate.kind == "percentile" and one.high - one.low < 0.005
