"""The ES engine pool on a Ray cluster of several nodes, built on this machine (``ray_cluster``).

``ray.cluster_utils.Cluster`` starts one raylet per node; each node declares 1 CPU, so two HF
engines of 1 CPU each land on two nodes. All nodes share this machine's filesystem, so the second
node is given its own start-state directory (``ESREASON_ENGINE_DIR`` in its raylet's environment):
an engine there cannot read the driver's copy and must write its node's own from the object store,
as on a cluster of several machines. What is checked:

- engines on both nodes; the second node gets the start state (its own copy, from the object
  store), every engine holds the trainer's centre, and closing the pool removes that copy;
- ``esreason train es`` joins the cluster by address (``backend.ray_address``): 3 updates of the
  demo ES config on the two nodes end with the checkpoint of the one-process run (its hash);
- the node of one engine removed in the middle of a step (from the scorer, once the first result is
  back: no timing), gracefully and then with a hard kill (SIGKILL of its raylet; its workers die with it): the
  step's rewards equal the sequential reference, and the lost engine is replaced on a node added
  meanwhile, from the trainer's centre.

Opt-in (``-m ray_cluster``; .ci/run runs it as its own part): a cluster of three raylets on a
2-core machine. The cluster's files live under a private ``RAY_TMPDIR``, so ``ray.init()``
elsewhere on the machine never finds this cluster's address.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import ray

from esreason.backends.engine import HFEngineOptions, policy_checksum, policy_state
from esreason.backends.ray_pool import RayEnginePool

pytestmark = [pytest.mark.ray_cluster, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
DEMO_ES = ROOT / "configs" / "demo" / "es.yaml"
STATE_DIR_VAR = "ESREASON_ENGINE_DIR"


def _env(**values: str):
    """``values`` in os.environ for the block (a raylet started inside inherits them)."""
    from esreason.backends.collective import environment

    return environment(values)


def _node_id(node) -> str:
    return node.node_id


class TwoNodes:
    """The cluster, its nodes and each non-head node's own start-state directory."""

    def __init__(self, root: Path) -> None:
        from ray.cluster_utils import Cluster

        self.root = root
        self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        self.head = self.cluster.head_node
        self.second = self.add_node("second")
        self.added: list[str] = []  # nodes added in place of a lost second node, by directory name

    def add_node(self, name: str):
        """A node of 1 CPU whose engines keep start states under their own directory."""
        with _env(**{STATE_DIR_VAR: str(self.root / name)}):
            return self.cluster.add_node(num_cpus=1)

    def state_copies(self, name: str) -> list[Path]:
        """The complete start states in node ``name``'s directory."""
        return sorted(p.parent for p in (self.root / name / "esreason-state").glob("*/.complete"))


@pytest.fixture(scope="module")
def two_nodes():
    root = Path(tempfile.mkdtemp(prefix="esr-ray-", dir="/tmp"))  # short: Ray's socket paths live under it
    with _env(RAY_TMPDIR=str(root)):
        nodes = TwoNodes(root)
        try:
            ray.init(address=nodes.cluster.address, logging_level="WARNING")
            yield nodes
        finally:
            ray.shutdown()
            nodes.cluster.shutdown()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def demo_policy():
    from esreason.backends.hf import HFPolicy, load_model

    model, tok = load_model("demo")
    return HFPolicy(model, tok)


def test_engines_on_both_nodes_and_the_second_node_gets_the_start_state(two_nodes, demo_policy):
    pool = RayEnginePool("hf", HFEngineOptions(), policy_state(demo_policy), 2, reference=demo_policy)
    try:
        assert sorted(pool.engine_nodes.values()) == sorted([_node_id(two_nodes.head), _node_id(two_nodes.second)])
        copies = two_nodes.state_copies("second")
        assert len(copies) == 1  # written once on that node, from the object store
        assert sorted(p.name for p in copies[0].iterdir() if p.name != ".complete") == sorted(policy_state(demo_policy))
        assert set(pool.checksums().values()) == {policy_checksum(demo_policy)}  # both nodes hold the centre
        # a joined cluster's workers run at Ray's nice 15; the pool's engines at normal priority
        want = os.nice(0) + int(os.environ.get("RAY_worker_niceness") or 0)
        assert sorted(pool.engine_niceness.values()) == [want, want]
    finally:
        pool.close()
    assert two_nodes.state_copies("second") == []  # the pool's close removed the second node's copy


def test_three_updates_on_two_nodes_end_with_the_one_node_checkpoint(two_nodes, tmp_path):
    """``esreason train es`` joins the cluster by address; the checkpoint equals the one-process run's."""
    from esreason.config import load_config
    from esreason.es_loop.run import run_es
    from esreason.io.hashing import hash_directory_safetensors

    steps = ["train.max_steps=3", "checkpoint.every=3"]
    one = run_es(load_config(str(DEMO_ES), [*steps, "backend.type=hf"]), tmp_path / "one", progress=False)
    cmd = [sys.executable, "-m", "esreason.cli", "train", "es", "--config", str(DEMO_ES),
           "--output", str(tmp_path / "two"), "--no-progress"]
    for item in (*steps, "backend.type=ray", "backend.engines=2", f"backend.ray_address={two_nodes.cluster.address}"):
        cmd += ["--set", item]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    two = tmp_path / "two"
    backend = json.loads((two / "backend.json").read_text())
    assert (backend["type"], backend["engine"], backend["engines"]) == ("ray", "hf", 2)
    assert len(set(backend["nodes"])) == 2  # one engine on each node
    step = two / "checkpoints" / "step_3"
    assert hash_directory_safetensors(step) == hash_directory_safetensors(one.final_checkpoint)
    rows = [[json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            for run in (tmp_path / "one", two)]
    for key in ("reward/mean", "reward/std", "update_norm", "tokens"):
        assert [r[key] for r in rows[1]] == [r[key] for r in rows[0]], key
    assert len(rows[0]) == 3 and all(r["update_norm"] > 0 for r in rows[0])


def _lose_a_node_mid_step(nodes: TwoNodes, policy, *, graceful: bool) -> None:
    """One population step on a pool of two engines (the head's and ``nodes.second``'s) whose scorer removes
    ``nodes.second`` once the first result is back (the engine there still holds members: every engine
    queues two) and adds a new node, which becomes ``nodes.second``. ``graceful=False`` kills the node's
    processes (its raylet) with SIGKILL (``remove_node(allow_graceful=False)``; the workers exit with their
    raylet): no goodbye to the GCS, the pool learns of it from the lost actor, as when a machine dies."""
    from test_ray_pool import _step_inputs

    from esreason.backends.sampling import Sampler
    from esreason.es_loop.evaluate import evaluate_population

    prompts, golds, scorer, pop, params = _step_inputs(policy, population_seed=7, first_seed=41)
    expected = evaluate_population(policy, Sampler(policy.model, policy.tokenizer), pop, 0.003,
                                   prompts, golds, scorer, params)
    pool = RayEnginePool("hf", HFEngineOptions(), policy_state(policy), 2, reference=policy)
    name = f"node{len(nodes.added) + 3}"
    try:
        second = _node_id(nodes.second)
        [victim] = [s for s in pool.slots if pool.engine_nodes[s.rank] == second]
        added = []

        def removing_scorer(text, gold):
            if not added:
                nodes.cluster.remove_node(nodes.second, allow_graceful=graceful)
                added.append(nodes.add_node(name))
            return scorer(text, gold)

        got = pool.evaluate(pop, 0.003, prompts, golds, removing_scorer, params)
        assert added and pool.stats.lost_engines == 1 and pool.stats.rerun_members >= 1
        assert victim not in pool.slots
        np.testing.assert_array_equal(got.rewards, expected.rewards)
        np.testing.assert_array_equal(got.correct, expected.correct)
        np.testing.assert_array_equal(got.formatted, expected.formatted)
        assert got.tokens == expected.tokens
        # before the next step the lost engine is replaced on the new node, from the trainer's centre
        sums = pool.checksums()
        assert pool.stats.replaced_engines == 1 and set(sums.values()) == {policy_checksum(policy)}
        assert sorted(pool.engine_nodes[s.rank] for s in pool.slots) == sorted(
            [_node_id(nodes.head), _node_id(added[0])])
        assert len(nodes.state_copies(name)) == 1
        nodes.second = added[0]
        nodes.added.append(name)
    finally:
        pool.close()
    assert nodes.state_copies(name) == []


def test_a_node_lost_mid_step_gives_the_same_result(two_nodes, demo_policy):
    """Runs after the tests above: it replaces the second node (removed gracefully)."""
    _lose_a_node_mid_step(two_nodes, demo_policy, graceful=True)


def test_a_node_killed_mid_step_gives_the_same_result(two_nodes, demo_policy):
    """The same with a hard kill: SIGKILL of the node's raylet."""
    _lose_a_node_mid_step(two_nodes, demo_policy, graceful=False)
