"""Clean output: the cache keyword, narrow filters for known library messages, warnings as errors."""

from __future__ import annotations

import functools
import logging
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import transformers

from esreason.backends import kvcache
from esreason.backends.kvcache import cache_keyword
from esreason.quiet import KnownLogLine, KnownWarning, known_library_noise

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- the cache keyword


class _NewForward:
    def forward(self, input_ids=None, cache=None, use_cache=None, **kwargs):  # transformers >= 5.24
        return None


class _OldForward:
    def forward(self, input_ids=None, past_key_values=None, use_cache=None, **kwargs):  # <= 5.23
        return None


def _renaming(func):
    """Like transformers' ``deprecate_kwarg`` and ``can_return_tuple``: a ``functools.wraps`` wrapper."""
    @functools.wraps(func)
    def wrapped(*args, **kwargs):
        return func(*args, **kwargs)
    return wrapped


class _DecoratedNewForward:
    @_renaming
    def forward(self, input_ids=None, cache=None, **kwargs):
        return None


class _KwargsOnlyForward:
    def forward(self, **kwargs):  # remote code: names neither
        return None


def test_cache_keyword_from_the_forward_signature():
    assert cache_keyword(_NewForward()) == "cache"
    assert cache_keyword(_OldForward()) == "past_key_values"
    assert cache_keyword(_DecoratedNewForward()) == "cache"  # seen through the deprecation wrapper


@pytest.mark.parametrize("version,name", [("5.20.2", "past_key_values"), ("5.23.0", "past_key_values"),
                                          ("5.24.0", "cache"), ("5.25.0.dev0", "cache"), ("6.0.0", "cache")])
def test_cache_keyword_from_the_version_when_the_signature_names_neither(monkeypatch, version, name):
    monkeypatch.setattr(kvcache, "transformers_version", lambda: version)
    assert cache_keyword(_KwargsOnlyForward()) == name


def test_installed_transformers_models_take_the_detected_keyword(tiny_model_dir):
    """The real forward of the installed release: the detected name is a declared parameter."""
    import inspect

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    name = cache_keyword(model)
    assert name in inspect.signature(model.forward).parameters
    renamed = kvcache._release(kvcache.transformers_version()) >= kvcache.CACHE_RENAMED_IN
    assert name == ("cache" if renamed else "past_key_values")


def test_sampler_prints_no_library_warning_or_log_line(tiny_model_dir, caplog):
    """The decode loop uses only the keyword the installed transformers expects: no FutureWarning,
    no DeprecationWarning, no ``[transformers]`` line (a logged record) on any release."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from esreason.backends.base import SamplingParams
    from esreason.backends.sampling import Sampler

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.padding_side = "left"
    transformers.logging.get_logger("transformers").propagate = True  # let caplog see transformers' records
    try:
        with warnings.catch_warnings(record=True) as seen, caplog.at_level(logging.INFO, logger="transformers"):
            warnings.simplefilter("always")
            for cache in ("auto", "dynamic"):
                Sampler(model, tok, batch_size=2, cache=cache).generate(
                    ["12+34=", "5+6=", "7+8="], SamplingParams(max_new_tokens=6, temperature=0.7, compute_entropy=True))
    finally:
        transformers.logging.get_logger("transformers").propagate = False
    assert [str(w.message) for w in seen] == []
    assert [r.getMessage() for r in caplog.records if r.name.startswith("transformers")] == []


# --------------------------------------------------------------------------- narrow filters


KNOWN_W = KnownWarning(FutureWarning, r"`old_name` is deprecated", r"somelib\.internals\b", "test")
KNOWN_L = KnownLogLine("somelib.trainer_utils", "mtime may not be reliable", "test")


def _warn_from(module: str, message: str, category: type[Warning] = FutureWarning) -> None:
    warnings.warn_explicit(message, category, f"{module.replace('.', '/')}.py", 1, module=module)


def test_known_library_warning_silenced_only_inside_the_block_and_only_from_its_module():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with known_library_noise([KNOWN_W], []):
            _warn_from("somelib.internals", "`old_name` is deprecated; use new_name")  # known: silenced
            _warn_from("otherlib.core", "`old_name` is deprecated; use new_name")  # same text elsewhere: shown
            _warn_from("somelib.internals", "something else changed")  # unknown message: shown
            _warn_from("esreason.backends.sampling", "our own deprecation")  # ours: shown
            warnings.warn("our own user warning", UserWarning)  # ours: shown
        _warn_from("somelib.internals", "`old_name` is deprecated; use new_name")  # after the block: shown
    assert [str(w.message) for w in seen] == [
        "`old_name` is deprecated; use new_name", "something else changed", "our own deprecation",
        "our own user warning", "`old_name` is deprecated; use new_name"]


def test_known_log_line_dropped_only_inside_the_block_and_only_from_its_logger(caplog):
    known = logging.getLogger("somelib.trainer_utils")
    other = logging.getLogger("somelib.other")
    ours = logging.getLogger("esreason.test")
    with caplog.at_level(logging.INFO):
        with known_library_noise([], [KNOWN_L]):
            known.warning("mtime may not be reliable on this filesystem, falling back")  # known: dropped
            known.warning("something else")  # unknown message: shown
            other.warning("mtime may not be reliable on this filesystem")  # other logger: shown
            ours.warning("our progress")  # ours: shown
        known.warning("mtime may not be reliable on this filesystem")  # after the block: shown
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("somelib.trainer_utils", "something else"),
        ("somelib.other", "mtime may not be reliable on this filesystem"),
        ("esreason.test", "our progress"),
        ("somelib.trainer_utils", "mtime may not be reliable on this filesystem")]
    assert not known.filters  # the filter is gone


def test_known_library_noise_removes_filters_when_the_call_raises():
    known = logging.getLogger("somelib.trainer_utils")
    before = list(warnings.filters)
    with pytest.raises(RuntimeError):
        with known_library_noise([KNOWN_W], [KNOWN_L]):
            raise RuntimeError("training failed")
    assert not known.filters
    assert warnings.filters == before


def test_trainer_mtime_note_silenced_at_the_call_site(tmp_path, caplog):
    """The real Trainer note (checkpoints saved within a second of each other), through the entry
    esreason.quiet lists for it: dropped inside the block, printed outside it."""
    from transformers import trainer_utils
    from transformers.utils import logging as hf_logging

    for step in (1, 2):
        (tmp_path / f"checkpoint-{step}").mkdir()
    root = hf_logging.get_logger("transformers")
    root.propagate = True  # let caplog see transformers' records
    try:
        with caplog.at_level(logging.INFO, logger="transformers"):
            hf_logging.warning_once.cache_clear()  # warning_once prints a message once per process
            with known_library_noise():
                trainer_utils.sort_checkpoints(str(tmp_path), use_mtime=True)
            inside = [r.getMessage() for r in caplog.records]
            hf_logging.warning_once.cache_clear()
            trainer_utils.sort_checkpoints(str(tmp_path), use_mtime=True)
            outside = [r.getMessage() for r in caplog.records][len(inside):]
    finally:
        root.propagate = False
    assert inside == []
    assert [m for m in outside if m.startswith("mtime may not be reliable")], outside


# --------------------------------------------------------------------------- warnings are errors


TRIGGERS = '''
import warnings


def _warn_as(module, category):
    # A warning raised by code whose module is `module` (what warnings.warn attributes it to).
    exec("import warnings\\nwarnings.warn('old API', CATEGORY, stacklevel=1)",
         {"__name__": module, "CATEGORY": category})


def test_our_deprecation():
    _warn_as("esreason.backends.sampling", DeprecationWarning)


def test_our_future_warning():
    _warn_as("esreason.grpo.run", FutureWarning)


def test_library_deprecation():
    _warn_as("somelib.internals", DeprecationWarning)


def test_lookalike_module():
    _warn_as("esreasonable.x", FutureWarning)
'''


def test_suite_fails_on_a_deprecation_from_our_code(tmp_path):
    """pyproject's filterwarnings: FutureWarning/DeprecationWarning from esreason modules are errors,
    from other modules they are not."""
    test_file = tmp_path / "test_triggers.py"
    test_file.write_text(TRIGGERS)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
         "-p", "no:cacheprovider", "-n", "0", "-q", "-rA", str(test_file)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "FAILED test_triggers.py::test_our_deprecation - DeprecationWarning: old API" in out, out
    assert "FAILED test_triggers.py::test_our_future_warning - FutureWarning: old API" in out, out
    assert "PASSED test_triggers.py::test_library_deprecation" in out, out
    assert "PASSED test_triggers.py::test_lookalike_module" in out, out


# --------------------------------------------------------------------------- a reader that leaves


def test_a_closed_pipe_ends_the_command_quietly(tmp_path):
    """`esreason tasks | grep -q x`: the reader leaves before the output is written. The command stops with
    SIGPIPE's status (141, as `ls | head` does) and no traceback. The pipe's read end is closed before the
    command starts, so its first write fails whatever the timing."""
    import os

    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "esreason.cli", "tasks"], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=300, cwd=tmp_path)
    finally:
        os.close(write)
    assert proc.returncode == 141, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
