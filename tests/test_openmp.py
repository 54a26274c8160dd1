"""The CLI bounds libgomp's spin before torch is imported, and leaves a user's choice alone (esreason.openmp)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from esreason import openmp


def test_configure_sets_the_spin_count_only_when_the_user_chose_nothing():
    env: dict[str, str] = {}
    assert openmp.configure(env) is True
    assert env == {"GOMP_SPINCOUNT": str(openmp.SPIN_COUNT)}
    assert openmp.describe(env) == f"GOMP_SPINCOUNT={openmp.SPIN_COUNT}"
    for user in ({"GOMP_SPINCOUNT": "300000"}, {"OMP_WAIT_POLICY": "active"}):
        env = dict(user)
        assert openmp.configure(env) is False
        assert env == user, "a user's wait policy or spin count wins"
    assert openmp.describe({"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "5"}) == "OMP_WAIT_POLICY=passive"
    assert openmp.describe({}) == "libgomp default spin (300000)"


PROBE = r"""
import json, sys
import esreason.openmp as o
torch_loaded = []
original = o.configure
def recording(environ=None):
    torch_loaded.append("torch" in sys.modules)
    return original(environ)
o.configure = recording
from esreason.cli import main
import contextlib, io
out = io.StringIO()
with contextlib.redirect_stdout(out):
    main(["info"])
device = next(line for line in out.getvalue().splitlines() if line.startswith("device"))
print(json.dumps({"torch_loaded_at_configure": torch_loaded, "device": device}))
"""


def _probe(extra: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update(extra)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_cli_sets_it_before_torch_is_imported_and_info_reports_it():
    got = _probe({})
    assert got["torch_loaded_at_configure"] == [False], "libgomp reads GOMP_SPINCOUNT once, at torch's import"
    assert f"GOMP_SPINCOUNT={openmp.SPIN_COUNT})" in got["device"]
    assert "OMP_WAIT_POLICY=passive)" in _probe({"OMP_WAIT_POLICY": "passive"})["device"]


def test_importing_esreason_bounds_the_spin_for_python_users_too():
    """The Python API gets the CLI's setting when esreason is imported before torch; torch first is flagged."""
    import subprocess
    import sys

    env = {k: v for k, v in __import__("os").environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    code = ("import os, sys; {first}import esreason; "
            "print(os.environ.get('GOMP_SPINCOUNT'), esreason.OPENMP_TOO_LATE, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code.format(first="")], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [str(openmp.SPIN_COUNT), "False", "False"]  # set before anything imported torch
    out = subprocess.run([sys.executable, "-c", code.format(first="import torch; ")], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == [str(openmp.SPIN_COUNT), "True", "True"]  # too late for this process: the API warns
    out = subprocess.run([sys.executable, "-c", code.format(first="")], env={**env, "GOMP_SPINCOUNT": "7"},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "7"  # the user's choice wins
