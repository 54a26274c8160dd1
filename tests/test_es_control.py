"""The shuffled-reward control of tests/test_es_improves.py: ES on shuffled rewards does not improve.

Its own file so that the control run trains on one xdist worker while the ES run trains on the
other (both results are shared through tests/shared_results.py; whichever worker needs a result
another is computing waits for it).
"""

from __future__ import annotations

import pytest

from test_es_improves import base_measured, control_measured, es_measured

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(1800)]


def test_shuffled_reward_control_does_not_improve(tmp_path_factory):
    control = control_measured(tmp_path_factory)
    base = base_measured(tmp_path_factory)
    assert control["greedy_acc"] <= base["greedy_acc"] + 0.01
    assert control["pass@1"] <= base["pass@1"] + 0.01
    es = es_measured(tmp_path_factory)  # trained on the other worker meanwhile (or here, alone)
    assert es["greedy_acc"] > control["greedy_acc"] and es["pass@1"] > control["pass@1"]
