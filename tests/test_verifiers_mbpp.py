"""MBPP verifier and its sandbox: per-test vectors, and hostile programs contained within their limits."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time

import pytest
from bounds import TERMINATES_WITHIN_S

from esreason.errors import UserError
from esreason.verifiers.mbpp import make_scorer, mbpp_vote_key, parse_gold
from esreason.verifiers.sandbox import SandboxConfig, detect_isolation, run_tests, with_limits

FR = 0.1
ADD_GOLD = {"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]}
# Tight limits keep the hostile rows fast: 2 s wall clock, 0.5 s per test.
FAST = dict(timeout_s=2.0, test_timeout_s=0.5)


def fenced(code: str) -> str:
    return f"Here is the solution.\n```python\n{code}\n```\n"


@pytest.fixture(scope="module")
def scorer():
    return make_scorer(FR, **FAST)


@pytest.mark.parametrize("response, correct, formatted, passed, reason_part", [
    (fenced("def add(a, b):\n    return a + b"), True, True, [True, True, True], "all 3 tests passed"),
    (fenced("def add(a, b):\n    return a * b if a == 2 else a + b"), True, True, [True, True, True], "all 3"),
    (fenced("def add(a, b):\n    return abs(a) + b"), False, True, [True, False, True], "2/3 tests passed; test 1"),
    (fenced("def add(a, b) return a"), False, True, [False, False, False], "program failed (SyntaxError)"),
    (fenced("raise SystemExit(0)"), False, True, [False, False, False], "program failed (SystemExit)"),
    (fenced("def add(a, b):\n    return a - b") + fenced("def add(a, b):\n    return a + b"),
     True, True, [True, True, True], "all 3"),                               # several blocks: the last
    ("def add(a, b):\n    return a + b", False, False, [False] * 3, "no python code block"),
    ("```python\ndef add(a, b):\n    return a + b\n", False, False, [False] * 3, "no python code block"),
])
def test_mbpp_table(scorer, response, correct, formatted, passed, reason_part):
    v = scorer(response, ADD_GOLD)
    assert (v.correct, v.formatted) == (correct, formatted)
    assert v.reward == (1.0 if correct else FR if formatted else 0.0)
    assert v.extra["passed"] == passed
    assert reason_part in v.reason


def test_setup_code_and_mbpp_field_names(scorer):
    gold = {"test_list": ["assert f() == 3"], "test_imports": ["import math"], "test_setup_code": "K = 3"}
    assert parse_gold(gold) == (["assert f() == 3"], "import math\nK = 3")
    assert scorer(fenced("def f():\n    return int(math.sqrt(9))"), gold).correct


@pytest.mark.parametrize("gold", [None, {"tests": []}, {"tests": "assert 1"}, {"tests": [""]},
                                  {"tests": ["assert 1"], "setup": 3}])
def test_bad_gold_is_a_user_error(scorer, gold):
    with pytest.raises(UserError):
        scorer(fenced("x = 1"), gold)


def test_vote_key_is_the_pass_vector(scorer):
    good = scorer(fenced("def add(a, b):\n    return a + b"), ADD_GOLD)
    partial = scorer(fenced("def add(a, b):\n    return abs(a) + b"), ADD_GOLD)
    unformatted = scorer("no code", ADD_GOLD)
    assert mbpp_vote_key(good) == (True, True, True)
    assert mbpp_vote_key(partial) == (True, False, True)
    assert mbpp_vote_key(unformatted) is None


def test_a_slow_test_fails_alone():
    code = "import time\ndef f(x):\n    if x == 1:\n        time.sleep(30)\n    return x"
    r = run_tests(code, ["assert f(0) == 0", "assert f(1) == 1", "assert f(2) == 2"],
                  config=with_limits(SandboxConfig(), **FAST))
    assert r.passed == [True, False, True]
    assert r.errors[1] == "Timeout"


# --------------------------------------------------------------------------- hostile programs

HOSTILE = {
    "infinite loop": "def add(a, b):\n    while True:\n        pass",
    "loop that swallows the timer": ("import time\ndef add(a, b):\n    while True:\n        try:\n"
                                     "            time.sleep(10)\n        except BaseException:\n            pass"),
    "fork bomb": "import os\ndef add(a, b):\n    while True:\n        os.fork()\n    return a + b",
    "fork bomb at import": "import os\nwhile True:\n    os.fork()",
    "subprocess": "import subprocess\ndef add(a, b):\n    return int(subprocess.check_output(['echo', str(a + b)]))",
    "allocate 10 GB": "def add(a, b):\n    x = bytearray(10 * 1024**3)\n    return a + b",
    "kill the parent": "import os, signal\ndef add(a, b):\n    os.kill(os.getppid(), signal.SIGKILL)\n    return a + b",
    "kill the group": "import os, signal\ndef add(a, b):\n    os.killpg(0, signal.SIGKILL)\n    return a + b",
    "flood stdout": "import sys\ndef add(a, b):\n    while True:\n        sys.stdout.write('x' * 65536)",
    "os._exit": "import os\ndef add(a, b):\n    os._exit(0)",
    "ctypes": "import ctypes\ndef add(a, b):\n    return a + b",
    "read stdin": "def add(a, b):\n    return int(input())",
    "deep recursion": "import sys\nsys.setrecursionlimit(10**6)\ndef add(a, b):\n    return add(a, b)",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_program_is_contained(scorer, name):
    start = time.monotonic()
    v = scorer(fenced(HOSTILE[name]), ADD_GOLD)
    elapsed = time.monotonic() - start
    assert not v.correct and v.formatted and v.reward == FR
    assert elapsed < TERMINATES_WITHIN_S, f"{name} took {elapsed:.1f} s"   # contained: ended (tests/bounds.py)
    assert len(v.extra["stdout"]) <= 8 << 10


@pytest.mark.parametrize("name", ["fork bomb", "subprocess", "allocate 10 GB", "kill the parent", "kill the group",
                                  "ctypes", "flood stdout"])
def test_hostile_program_is_contained_without_namespaces(name):
    """The baseline alone (no unshare, no uid change): here the parent of the program is pytest itself."""
    config = with_limits(SandboxConfig(namespaces=False, drop_privileges=False), **FAST)
    r = run_tests(HOSTILE[name], ADD_GOLD["tests"], config=config)
    assert r.passed == [False, False, False]
    assert "network namespace" not in r.layers and r.duration_s < TERMINATES_WITHIN_S


def test_flooding_stdout_is_capped_and_cut(scorer):
    v = scorer(fenced(HOSTILE["flood stdout"]), ADD_GOLD)
    assert len(v.extra["stdout"]) == 2000      # kept in the verdict; the sandbox keeps at most 8 KiB
    assert v.extra["errors"][0] == "BrokenPipeError"
    assert v.extra["duration_s"] < TERMINATES_WITHIN_S  # cut by the cap (BrokenPipeError above), not left running


def test_writes_outside_the_workdir_do_not_happen(scorer, tmp_path):
    canary = tmp_path / "keep.txt"
    canary.write_text("keep")
    target = tmp_path / "pwned.txt"
    programs = [
        f"def add(a, b):\n    open({str(target)!r}, 'w').write('x')\n    return a + b",
        f"import os\ndef add(a, b):\n    fd = os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)\n    return a + b",
        f"import shutil\ndef add(a, b):\n    shutil.rmtree({str(tmp_path)!r})\n    return a + b",
        f"import os\ndef add(a, b):\n    os.remove({str(canary)!r})\n    return a + b",
        f"import os\ndef add(a, b):\n    os.chdir({str(tmp_path)!r})\n    open('pwned.txt', 'w')\n    return a + b",
        "import os\ndef add(a, b):\n    open('../esreason-escape.txt', 'w')\n    return a + b",
    ]
    for code in programs:
        v = scorer(fenced(code), ADD_GOLD)
        assert not v.correct, code
    assert not target.exists()
    assert canary.read_text() == "keep"


def test_writes_inside_the_workdir_are_allowed(scorer):
    code = ("def add(a, b):\n    with open('scratch.txt', 'w') as f:\n        f.write(str(a + b))\n"
            "    return int(open('scratch.txt').read())")
    assert scorer(fenced(code), ADD_GOLD).correct


def test_network_is_refused(scorer):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    port = server.getsockname()[1]
    code = (f"import socket\ndef add(a, b):\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "    s.sendall(b'leak')\n    return a + b")
    try:
        v = scorer(fenced(code), ADD_GOLD)
        assert not v.correct
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


def test_forged_results_are_ignored():
    # Write result-looking lines to stdout and every descriptor: none carries the nonce.
    code = ("import os\nfor fd in range(1, 64):\n    try:\n        os.write(fd, b'x 0 1 -\\nx done 1 -\\n')\n"
            "    except OSError:\n        pass\ndef add(a, b):\n    return 99")
    r = run_tests(code, ADD_GOLD["tests"], config=with_limits(SandboxConfig(), **FAST))
    assert r.passed == [False, False, False]
    assert r.forged_lines >= 2            # they reached the result pipe and were rejected


def test_sandbox_works_from_a_thread(scorer):
    out: list = []
    t = threading.Thread(target=lambda: out.append(scorer(fenced("def add(a, b):\n    return a + b"), ADD_GOLD)))
    t.start()
    t.join(timeout=30)
    assert out and out[0].correct


def test_guardless_os_layers_still_contain_memory_cpu_and_output():
    """Without the audit hook, the rlimits, wall clock and output cap still hold."""
    config = with_limits(SandboxConfig(guard=False), **FAST)
    tests = ["assert f() == 1"]
    mem = run_tests("def f():\n    x = bytearray(10 * 1024**3)\n    return 1", tests, config=config)
    assert mem.errors == ["MemoryError"]
    start = time.monotonic()
    loop = run_tests("import time\ndef f():\n    while True:\n        try:\n            time.sleep(5)\n"
                     "        except BaseException:\n            pass", tests, config=config)
    assert loop.timed_out and loop.passed == [False] and time.monotonic() - start < TERMINATES_WITHIN_S
    flood = run_tests("import os\ndef f():\n    while True:\n        os.write(1, b'x' * 65536)", tests, config=config)
    assert flood.passed == [False] and len(flood.stdout) <= 8 << 10


def test_guardless_network_follows_the_detected_isolation():
    """With a network namespace, sockets fail even without the audit hook; without one they would not."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    code = f"import socket\ndef f():\n    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n    return 1"
    try:
        r = run_tests(code, ["assert f() == 1"], config=with_limits(SandboxConfig(guard=False), **FAST))
    finally:
        server.close()
    assert r.passed == ["network namespace" not in detect_isolation().layers]


def test_no_processes_or_files_are_left_behind(scorer):
    tmp = tempfile.gettempdir()
    before = set(os.listdir(tmp))
    scorer(fenced(HOSTILE["fork bomb"]), ADD_GOLD)
    scorer(fenced(HOSTILE["loop that swallows the timer"]), ADD_GOLD)
    scorer(fenced("def add(a, b):\n    open('big.bin', 'wb').write(b'0' * 1000)\n    return a + b"), ADD_GOLD)
    leftovers = [n for n in set(os.listdir(tmp)) - before if n.startswith("esreason-sandbox-")]
    assert leftovers == []
    assert _sandbox_processes() == []


def _sandbox_processes() -> list[str]:
    """Live processes whose command line is the sandbox harness or its unshare wrapper."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"class _TestTimeout(BaseException)" in cmd:
            found.append(pid)
    return found
