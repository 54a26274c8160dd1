"""GRPO across machines: accelerate's multi-node launch, two "machines" on this one (``multinode``).

Each machine is its own ``accelerate launch --num_machines 2 --machine_rank R --main_process_ip
127.0.0.1`` with one process (gloo on the CPU), as on two hosts; ``--num_processes`` is the total.
What is checked:

- 2 machines x 1 process end with the checkpoint of 1 machine x 2 processes, bit for bit, at
  temperature 1 (ranks, the batch plan and every process's sampling stream are global: nothing
  depends on the machine a rank runs on), and every process's RNG state is in the shared RUN/trl;
- the machines must share the run directory: different ``--output`` per machine, or a machine
  whose run directory is a disk of its own (a private tmpfs mounted over it in a mount namespace,
  ``unshare --mount``), is refused on every process with one line, and nothing is written.

Opt-in (``-m multinode``; .ci/run runs it with the two-node Ray tests): four launches on a 2-core
machine, about 90 s.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multinode, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
DEMO_CONFIG = ROOT / "configs" / "demo" / "grpo.yaml"
# 2 updates of 8 prompts x 8 responses at temperature 1 (the demo's); 2 processes split the 64 sequences.
SETS = ["train.max_steps=2", "checkpoint.every=1", "grpo.micro_batch_size=32", "eval.every=0",
        "generation.max_new_tokens=48"]
TIMEOUT_S = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false")
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "ACCELERATE_USE_FSDP",
                "ACCELERATE_USE_DEEPSPEED"):
        env.pop(key, None)
    return env


def _command(out: Path, machines: int, rank: int, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--mixed_precision", "no",
           "--dynamo_backend", "no", "--num_processes", "2", "--num_machines", str(machines),
           "--main_process_port", str(port)]
    if machines > 1:
        cmd += ["--machine_rank", str(rank), "--main_process_ip", "127.0.0.1"]
    cmd += ["-m", "esreason.cli", "train", "grpo", "--config", str(DEMO_CONFIG), "--output", str(out), "--no-progress"]
    for item in SETS:
        cmd += ["--set", item]
    return cmd


def launch_machines(outs: list[Path], prefixes: list[list[str]] | None = None) -> list[subprocess.CompletedProcess]:
    """One launch per machine (``outs[r]``: machine r's --output), all at once; each one's result."""
    port = _free_port()
    prefixes = prefixes or [[] for _ in outs]
    procs = [subprocess.Popen([*prefix, *_command(out, len(outs), rank, port)], env=_env(), cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank, (out, prefix) in enumerate(zip(outs, prefixes))]
    results = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=TIMEOUT_S)
            results.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return results


def _error_lines(results: list[subprocess.CompletedProcess]) -> list[str]:
    return [line for r in results for line in r.stderr.splitlines() if line.startswith("esreason: error:")]


def test_two_machines_end_with_the_checkpoint_of_one_machine(tmp_path):
    from safetensors.torch import load_file

    [one] = launch_machines([tmp_path / "one"])
    assert one.returncode == 0, one.stderr[-3000:]
    two = launch_machines([tmp_path / "two"] * 2)
    assert [r.returncode for r in two] == [0, 0], two[0].stderr[-3000:] + two[1].stderr[-3000:]
    a = load_file(tmp_path / "one" / "checkpoints" / "step_2" / "model.safetensors")
    b = load_file(tmp_path / "two" / "checkpoints" / "step_2" / "model.safetensors")
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    base = load_file(ROOT / "src" / "esreason" / "assets" / "demo" / "model.safetensors")
    assert any(not a[k].equal(base[k]) for k in a if k in base)  # 2 updates moved the weights
    assert sorted(p.name for p in (tmp_path / "two" / "trl" / "checkpoint-2").glob("rng_state*")) == [
        "rng_state_0.pth", "rng_state_1.pth"]  # the second machine's process wrote into the shared RUN
    assert sum("GRPO run finished" in r.stdout for r in two) == 1  # rank 0 alone reports and writes


def test_machines_with_different_run_directories_are_refused(tmp_path):
    results = launch_machines([tmp_path / "a", tmp_path / "b"])
    assert [r.returncode for r in results] != [0, 0]
    lines = _error_lines(results)
    assert len(lines) == 2 and all("were given different run directories" in line for line in lines), lines
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def _own_disk_prefix(disk: Path) -> list[str]:
    """Machine 1's view of ``disk``: an empty tmpfs of its own (a private mount namespace; as root
    directly, otherwise inside a user namespace that maps this user to root)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs util-linux `unshare` to give the second machine a disk of its own")
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    script = f'mount -t tmpfs tmpfs "{disk}" && exec "$@"'
    probe = subprocess.run([unshare, *user, "--mount", "--propagation", "private", "sh", "-c", script, "sh", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private tmpfs here ({probe.stderr.strip()[:200]})")
    return [unshare, *user, "--mount", "--propagation", "private", "sh", "-c", script, "sh"]


def test_a_machine_that_does_not_see_the_run_directory_is_refused(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    results = launch_machines([disk / "run"] * 2, prefixes=[[], _own_disk_prefix(disk)])
    assert [r.returncode for r in results] != [0, 0]
    lines = _error_lines(results)
    assert len(lines) == 2 and all("needs the run directory on a filesystem every machine shares" in line
                                   for line in lines), lines
    assert list(disk.iterdir()) == []  # nothing written
