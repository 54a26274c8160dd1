"""Paired streaming access to checkpoints: sharded layouts, chunking, the streaming writer, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from esreason.analysis.weights.checkpoints import Checkpoint, SafetensorsStreamWriter, check_compatible, paired_chunks
from esreason.analysis.weights.drift import parse_taus
from esreason.analysis.weights.pair import analyze_pair
from esreason.errors import UserError


def write_ckpt(path: Path, tensors: dict[str, torch.Tensor], tie: bool = False) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "tie_word_embeddings": tie}))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def write_sharded(path: Path, shards: list[dict[str, torch.Tensor]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    weight_map = {}
    for i, sh in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sh, str(path / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in sh})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def tensors(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(7, 5, generator=g), "b.bias": torch.randn(3, generator=g),
            "c.norm.weight": torch.randn(11, generator=g).to(torch.bfloat16)}


def test_sharded_and_single_file_give_identical_statistics(tmp_path):
    b, t = tensors(0), tensors(1)
    single_b, single_t = write_ckpt(tmp_path / "sb", b), write_ckpt(tmp_path / "st", t)
    shard_b = write_sharded(tmp_path / "hb", [{"a.weight": b["a.weight"]},
                                              {k: b[k] for k in ("b.bias", "c.norm.weight")}])
    shard_t = write_sharded(tmp_path / "ht", [{k: t[k] for k in ("a.weight", "b.bias")},
                                              {"c.norm.weight": t["c.norm.weight"]}])
    taus = parse_taus("0.1,1")
    x = analyze_pair(single_b, single_t, taus=taus, topk=4).drift.to_json()
    y = analyze_pair(shard_b, shard_t, taus=taus, topk=4).drift.to_json()
    assert x == y
    # chunking changes only the float64 summation order: counts exact, sums to rounding
    z = analyze_pair(shard_b, shard_t, taus=taus, topk=4, chunk_elems=4).drift.to_json()
    assert z["num_changed"] == x["num_changed"] and z["s_tau"] == x["s_tau"]
    assert z["histogram"] == x["histogram"] and z["max_abs_update"] == x["max_abs_update"]
    assert z["relative_l2"] == pytest.approx(x["relative_l2"], rel=1e-13)
    for k in x["thresholded_relative_l2"]:
        assert z["thresholded_relative_l2"][k] == pytest.approx(x["thresholded_relative_l2"][k], rel=1e-13)
    # float64 accumulation equals a direct computation
    sq = sum(float(((t[k].double() - b[k].double()) ** 2).sum()) for k in b)
    assert x["l2"] == pytest.approx(sq ** 0.5, rel=1e-14)


def test_chunks_cover_every_element_in_row_major_order(tmp_path):
    b = {"w": torch.arange(35, dtype=torch.float32).reshape(7, 5), "s": torch.tensor(2.0)}
    ck = write_ckpt(tmp_path / "b", b)
    c = Checkpoint(ck)
    with c.reader(chunk_elems=10) as r:
        parts = list(r.chunks(c.infos["w"]))
        assert [off for off, _ in parts] == [0, 10, 20, 30]   # 2 rows of 5 per chunk
        assert torch.equal(torch.cat([x for _, x in parts]), b["w"].reshape(-1))
        (off, s), = list(r.chunks(c.infos["s"]))               # 0-d tensor
        assert off == 0 and s.tolist() == [2.0]


def test_different_names_or_shapes_are_errors_naming_the_tensor(tmp_path):
    b = write_ckpt(tmp_path / "b", {"x.weight": torch.zeros(2, 3), "y.weight": torch.zeros(2)})
    missing = write_ckpt(tmp_path / "m", {"x.weight": torch.zeros(2, 3)})
    extra = write_ckpt(tmp_path / "e", {"x.weight": torch.zeros(2, 3), "y.weight": torch.zeros(2),
                                        "z.weight": torch.zeros(1)})
    shape = write_ckpt(tmp_path / "s", {"x.weight": torch.zeros(3, 2), "y.weight": torch.zeros(2)})
    with pytest.raises(UserError, match="'y.weight' is in base"):
        check_compatible(Checkpoint(b, "base"), Checkpoint(missing, "tuned"))
    with pytest.raises(UserError, match="'z.weight' is in tuned"):
        check_compatible(Checkpoint(b, "base"), Checkpoint(extra, "tuned"))
    with pytest.raises(UserError, match=r"'x.weight' has shape \[2, 3\] in base but \[3, 2\] in tuned"):
        check_compatible(Checkpoint(b, "base"), Checkpoint(shape, "tuned"))


def test_bad_directories_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        Checkpoint(tmp_path / "nope")
    (tmp_path / "noconfig").mkdir()
    with pytest.raises(UserError, match="no config.json"):
        Checkpoint(tmp_path / "noconfig")
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text("{}")
    with pytest.raises(UserError, match="neither model.safetensors nor"):
        Checkpoint(tmp_path / "noweights")
    d = write_sharded(tmp_path / "lost", [{"a": torch.zeros(1)}])
    (d / "model-00001-of-00001.safetensors").unlink()
    with pytest.raises(UserError, match="shard model-00001-of-00001.safetensors is missing"):
        Checkpoint(d)
    bad = tmp_path / "corrupt"
    bad.mkdir()
    (bad / "config.json").write_text("{}")
    (bad / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(UserError, match="cannot read"):
        Checkpoint(bad)


def test_non_finite_values_are_reported(tmp_path):
    b = write_ckpt(tmp_path / "b", {"w": torch.zeros(3)})
    t = write_ckpt(tmp_path / "t", {"w": torch.tensor([0.0, float("nan"), 1.0])})
    with pytest.raises(UserError, match="'w' holds non-finite"):
        analyze_pair(b, t, taus=parse_taus("1e-3"))


def test_streaming_writer_round_trips_all_dtypes_and_layouts(tmp_path):
    data = {"a": torch.randn(4, 3), "b": torch.randn(5).to(torch.bfloat16), "c": torch.tensor(3.5, dtype=torch.float16),
            "d": torch.zeros(0, 4), "e": torch.arange(6, dtype=torch.int64).reshape(2, 3)}
    from esreason.analysis.weights.checkpoints import TORCH_TO_ST

    order = ["d", "a", "b", "c", "e"]  # a zero-size tensor first
    w = SafetensorsStreamWriter(tmp_path / "x.safetensors",
                                [(n, TORCH_TO_ST[data[n].dtype], tuple(data[n].shape)) for n in order])
    for n in order:
        flat = data[n].reshape(-1)
        for i in range(0, max(flat.numel(), 1), 2):   # write in 2-element chunks
            w.write(n, flat[i:i + 2])
    w.close()
    back = load_file(str(tmp_path / "x.safetensors"))
    for n, v in data.items():
        assert back[n].dtype == v.dtype and torch.equal(back[n], v), n
    w2 = SafetensorsStreamWriter(tmp_path / "y.safetensors", [("a", "F32", (2,)), ("b", "F32", (1,))])
    with pytest.raises(RuntimeError, match="out of order"):
        w2.write("b", torch.zeros(1))
    w2.write("a", torch.zeros(2))
    with pytest.raises(RuntimeError, match="'b' not written"):
        w2.close()


def test_paired_chunks_are_aligned(tmp_path):
    b, t = tensors(0), tensors(1)
    pb, pt = write_ckpt(tmp_path / "b", b), write_ckpt(tmp_path / "t", t)
    seen = {}
    for ch in paired_chunks(Checkpoint(pb), Checkpoint(pt), chunk_elems=6):
        seen.setdefault(ch.name, []).append((ch.offset, ch.base, ch.tuned))
    for name, parts in seen.items():
        assert torch.equal(torch.cat([p[1] for p in parts]), b[name].reshape(-1))
        assert torch.equal(torch.cat([p[2] for p in parts]), t[name].reshape(-1))
