"""docs/troubleshooting.md shows the messages esreason really prints: each message below is produced
by the code that raises or logs it, with the inputs the page's example names, and must appear on the
page verbatim (the page's `text` blocks are not run, so nothing else would notice a reworded message)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from esreason import info
from esreason.errors import UserError
from test_info_driver import fake_torch, use_driver

PAGE = (Path(__file__).resolve().parents[1] / "docs" / "troubleshooting.md").read_text(encoding="utf-8")


def shown(message: str) -> None:
    assert message in PAGE, f"docs/troubleshooting.md does not show what esreason prints:\n{message}"


def test_the_driver_line_of_esreason_info(monkeypatch):
    use_driver(monkeypatch, "575.57.08", driver_cuda="12.9", source="nvml")
    shown(info._driver_line(info.device_info(fake_torch(cuda="13.0", available=False))))


def _reward_error(func, n=64) -> str:
    from esreason.verifiers.reward_functions import RewardFunctions

    rows = [{"prompt": "What is 2 + 3?"}] + [{"prompt": f"What is {i} + 1?"} for i in range(n - 1)]
    with pytest.raises(UserError) as caught:
        RewardFunctions(func).per_function(["5"] * n, rows)
    return f"esreason: error: {caught.value}"


def test_the_reward_function_errors():
    def my_reward(prompts, completions, **kwargs):
        return {}["answer"]

    shown(_reward_error(my_reward))

    def my_reward(prompts, completions, **kwargs):  # noqa: F811  (each example is one function named so)
        return [1.0] * (len(completions) - 1)

    shown(_reward_error(my_reward))

    def my_reward(prompts, completions, **kwargs):  # noqa: F811
        return [float("nan") if i == 5 else 1.0 for i in range(len(completions))]

    shown(_reward_error(my_reward))

    def my_reward(prompts, completions, **kwargs):  # noqa: F811
        return ["yes"] * len(completions)

    shown(_reward_error(my_reward))


def test_the_resume_refusal(tmp_path, monkeypatch):
    import yaml

    from esreason.config import RunConfig, build, merge, to_dict
    from esreason.es_loop.resume import check_resume_config

    def config(sigma: float, steps: int) -> RunConfig:
        return build(RunConfig, merge(to_dict(RunConfig()), {"es": {"sigma": sigma}, "train": {"max_steps": steps}}))

    monkeypatch.chdir(tmp_path)
    run = Path("runs/es")
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(config(0.002, 1))))
    with pytest.raises(UserError) as caught:
        check_resume_config(run, config(0.003, 2))
    shown(f"esreason: error: {caught.value}")


def test_the_unreachable_ray_address():
    from esreason.backends.ray_connect import check_address

    with socket.socket() as free:  # a port nothing listens on: the connection is refused at once
        free.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{free.getsockname()[1]}"
    with pytest.raises(UserError) as caught:
        check_address(address)
    shown(f"esreason: error: {caught.value}".replace(address, "10.0.0.5:6379"))


def test_the_engine_priority_warning(monkeypatch):
    from esreason.backends import ray_niceness

    monkeypatch.delenv(ray_niceness.ENV, raising=False)
    shown(ray_niceness.mismatch_warning({0: 0, 1: 10}, 0))
