"""The CPU priority of esreason's Ray actors and how esreason starts its own Ray instance (no Ray
started here: the actors themselves report their niceness in tests/test_ray_pool.py).
"""

from __future__ import annotations

import pytest

from esreason.backends import ray_niceness
from esreason.backends.ray_connect import local_address
from esreason.errors import UserError


def test_normal_priority_unless_the_user_chose():
    assert ray_niceness.worker_niceness({}) == 0
    assert ray_niceness.worker_niceness({"RAY_worker_niceness": ""}) == 0
    assert ray_niceness.worker_niceness({"RAY_worker_niceness": " 7 "}) == 7
    assert ray_niceness.worker_niceness({"RAY_worker_niceness": "-3"}) == -3
    assert ray_niceness.actor_runtime_env({}) == {"env_vars": {"RAY_worker_niceness": "0"}}
    assert ray_niceness.actor_runtime_env({"RAY_worker_niceness": "15"}) == {"env_vars": {"RAY_worker_niceness": "15"}}


@pytest.mark.parametrize("raw", ["low", "1.5", "20", "-21"])
def test_a_bad_value_names_the_variable(raw):
    with pytest.raises(UserError, match=r"environment variable RAY_worker_niceness="):
        ray_niceness.worker_niceness({"RAY_worker_niceness": raw})


def test_info_shows_the_priority_in_force():
    from esreason import info

    assert ray_niceness.describe({}) == "nice 0 (esreason default; RAY_worker_niceness unset)"
    assert ray_niceness.describe({"RAY_worker_niceness": "15"}) == "nice 15 (RAY_worker_niceness=15)"
    assert ray_niceness.describe({"RAY_worker_niceness": "x"}).startswith("invalid: environment variable")
    text = info.format_info(info.info_dict())
    assert "ray workers   nice " in text


def test_mismatch_is_one_line_naming_the_engines():
    assert ray_niceness.expected_niceness(0, base=0) == 0
    assert ray_niceness.expected_niceness(5, base=10) == 15  # Ray's nice() adds to the raylet's niceness
    assert ray_niceness.expected_niceness(15, base=10) == 19  # the kernel's bound
    assert ray_niceness.mismatch_warning({0: 0, 1: 0}, 0) is None
    assert ray_niceness.mismatch_warning({0: 10, 1: 10}, 10) is None  # a driver under `nice` passed it on
    assert ray_niceness.mismatch_warning({0: 0}, 5) is None  # higher priority than asked is no harm
    line = ray_niceness.mismatch_warning({0: 0, 1: 5, 2: 5}, 0, who="evaluation")
    assert "\n" not in line and line.startswith("evaluation: engine 1: nice 5, engine 2: nice 5, not nice 0")
    assert "RAY_worker_niceness" in line and "ray start" in line


def test_esreason_starts_a_new_local_instance_unless_ray_address_is_set():
    """Ray's default ``ray.init()`` joins the cluster last started on this machine (its address file
    outlives a killed cluster); esreason asks for a new local one, or follows RAY_ADDRESS."""
    assert local_address({}) == "local"
    assert local_address({"RAY_ADDRESS": ""}) == "local"
    assert local_address({"RAY_ADDRESS": "10.0.0.1:6379"}) is None
