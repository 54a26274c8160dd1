"""Run untrusted generated Python against tests, contained and bounded.

DESIGN §6 requires that untrusted model output never runs unbounded. This is the
baseline human-eval/evalplus use (which call themselves "not a security
sandbox"), plus the Linux namespaces that are available without extra packages.
It bounds accidents and naive hostility — infinite loops, fork bombs, memory and
output floods, stray writes, killing the parent — it is **not a security
boundary** (see docs/verifiers.md, "What the sandbox does not protect against").

Layers, outermost first (``Isolation.layers`` says which ones a run got):

1. A fresh interpreter: ``python -s -S -B [-P] -c <harness>`` (no user or site
   packages, no bytecode files, no script directory on ``sys.path``) with a fully
   controlled minimal environment (``PYTHONHASHSEED=0`` for reproducible verdicts,
   which ``-I``/``-E`` would not allow), a fresh private temporary directory as
   cwd/HOME/TMPDIR, stdin at /dev/null, ``start_new_session=True``.
2. Namespaces when ``unshare`` works (probed once per process): a new network
   namespace (no interfaces but a down loopback: no network) and a new PID
   namespace (the program cannot see or signal any process outside it; when it
   exits, the kernel kills everything it started). As root: ``unshare --net
   --pid --fork --kill-child``; otherwise with ``--user --map-root-user``.
3. Resource limits set by the harness before the program runs (hard = soft):
   RLIMIT_CPU, RLIMIT_AS (address space), RLIMIT_FSIZE, RLIMIT_NOFILE,
   RLIMIT_CORE=0 and RLIMIT_NPROC=1 (no new processes or threads; not enforced for
   root, hence 4).
4. When started as root: the harness drops to uid/gid ``nobody`` (probed: only if
   the interpreter still works as ``nobody``), so the program cannot write the
   caller's files, cannot signal the caller's processes, and RLIMIT_NPROC applies.
5. An audit hook (PEP 578) in the child refusing process creation, signals,
   sockets, ctypes and writes/removals outside the working directory.
6. The runner: a wall-clock deadline after which the whole process group is
   SIGKILLed, capped reads of stdout/stderr (the rest is discarded; a pipe that
   overflows is closed, so the writer gets EPIPE), and per-test results read from
   a private pipe (not stdout), tagged with a random nonce.
"""

from __future__ import annotations

import json
import math
import os
import pwd
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

_CHILD_SOURCE = (Path(__file__).with_name("sandbox_child.py")).read_text(encoding="utf-8")
_RESULT_CAP = 1 << 20


@dataclass(frozen=True)
class SandboxLimits:
    """Bounds for one program run.

    timeout_s: wall clock for the whole run (interpreter start included).
    test_timeout_s: per step (loading the program, each test) via SIGALRM, so one
        slow test fails alone and later tests still run.
    cpu_s: RLIMIT_CPU in seconds (default: ceil(timeout_s) + 1).
    memory_bytes: RLIMIT_AS. file_size_bytes: RLIMIT_FSIZE. open_files: RLIMIT_NOFILE.
    output_bytes: how much of stdout and of stderr is kept (the rest is dropped).
    """

    timeout_s: float = 10.0
    test_timeout_s: float = 3.0
    cpu_s: int | None = None
    memory_bytes: int = 1 << 30
    file_size_bytes: int = 8 << 20
    open_files: int = 64
    output_bytes: int = 8 << 10

    def rlimits(self) -> dict[str, int]:
        cpu = self.cpu_s if self.cpu_s is not None else math.ceil(self.timeout_s) + 1
        return {"RLIMIT_CPU": int(cpu), "RLIMIT_AS": int(self.memory_bytes),
                "RLIMIT_FSIZE": int(self.file_size_bytes), "RLIMIT_NOFILE": int(self.open_files),
                "RLIMIT_CORE": 0, "RLIMIT_NPROC": 1}


@dataclass(frozen=True)
class SandboxConfig:
    """What the sandbox may use; ``None`` means "automatic" (use it when it works here)."""

    limits: SandboxLimits = field(default_factory=SandboxLimits)
    namespaces: bool | None = None
    drop_privileges: bool | None = None
    guard: bool = True
    site_packages: bool = False


@dataclass(frozen=True)
class Isolation:
    """The OS-level isolation a run uses: a command prefix and an optional uid/gid to drop to."""

    prefix: tuple[str, ...]
    drop_to: tuple[int, int] | None

    @property
    def layers(self) -> list[str]:
        out = ["fresh interpreter", "rlimits", "session kill"]
        if self.prefix:
            out += ["network namespace", "pid namespace"] + (["user namespace"] if "--user" in self.prefix else [])
        if self.drop_to is not None:
            out.append(f"uid {self.drop_to[0]}")
        return out


@dataclass
class RunResult:
    """Outcome of one sandboxed run.

    passed/errors: one entry per test (error: exception name, "Timeout", "NoResult"
    when the process ended or was killed before reporting, "ProgramFailed" when the
    program itself failed to load). loaded: the program + setup ran without error;
    load_error: the exception name when they did not.
    finished: the harness reported completion. timed_out: the wall clock expired.
    """

    passed: list[bool]
    errors: list[str | None]
    loaded: bool
    load_error: str | None
    finished: bool
    timed_out: bool
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    layers: list[str]
    forged_lines: int = 0

    @property
    def all_passed(self) -> bool:
        return bool(self.passed) and all(self.passed) and self.loaded


# --------------------------------------------------------------------------- isolation probe

_PROBE_LOCK = threading.Lock()
_PROBED: dict[tuple[bool | None, bool | None], Isolation] = {}
_PROBE_PROGRAM = "import heapq, fractions, collections, re, math\ndef f():\n    return math.isqrt(9)\n"


def _unshare_prefix() -> tuple[str, ...]:
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    flags = ("--net", "--pid", "--fork", "--kill-child")
    if os.geteuid() != 0:
        flags = ("--user", "--map-root-user") + flags
    return (exe,) + flags


def _nobody() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


def detect_isolation(namespaces: bool | None = None, drop_privileges: bool | None = None) -> Isolation:
    """The strongest isolation that actually runs a small program here (probed once, cached).

    ``True`` forces a layer (RuntimeError if it cannot work), ``False`` disables it,
    ``None`` uses it when the probe succeeds.
    """
    key = (namespaces, drop_privileges)
    with _PROBE_LOCK:
        if key in _PROBED:
            return _PROBED[key]
        prefixes = [_unshare_prefix()] if namespaces is not False else [()]
        if namespaces is None and prefixes[0]:
            prefixes.append(())
        drops: list[tuple[int, int] | None] = [None]
        if drop_privileges is not False and os.geteuid() == 0:
            drops = [_nobody()] + ([None] if drop_privileges is None else [])
        if namespaces and not prefixes[0]:
            raise RuntimeError("sandbox: namespaces requested but `unshare` is not available")
        if drop_privileges and os.geteuid() != 0:
            raise RuntimeError("sandbox: dropping privileges needs root")
        for prefix in prefixes:
            for drop in drops:
                candidate = Isolation(prefix, drop)
                probe = _execute(_PROBE_PROGRAM, "", ["assert f() == 3"], SandboxConfig(), candidate)
                if probe.all_passed:
                    _PROBED[key] = candidate
                    return candidate
        raise RuntimeError("sandbox: no isolation level could run a trivial program "
                           f"(last stderr: {probe.stderr[-500:]!r})")


# --------------------------------------------------------------------------- running


def _env(workdir: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir,
            "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONHASHSEED": "0",
            "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1"}


def _command(config: SandboxConfig, isolation: Isolation, payload_path: str, result_fd: int) -> list[str]:
    flags = ["-s", "-B"] + ([] if config.site_packages else ["-S"])
    if sys.version_info >= (3, 11):
        flags.append("-P")
    return [*isolation.prefix, sys.executable, *flags, "-c", _CHILD_SOURCE, payload_path, str(result_fd)]


class _Stream:
    """A pipe read with a cap: keeps the first ``cap`` bytes, closes the pipe once it overflows."""

    def __init__(self, fd: int, cap: int) -> None:
        self.fd, self.cap = fd, cap
        self.data = bytearray()
        self.overflowed = False
        self.open = True

    def read(self) -> bool:
        """Read what is available; False when the stream should now be closed (EOF or overflow)."""
        chunk = os.read(self.fd, 65536)
        if not chunk:
            return False
        room = self.cap - len(self.data)
        self.data += chunk[:max(room, 0)]
        if len(chunk) > room:
            self.overflowed = True
            return False
        return True

    def close(self) -> None:
        if self.open:
            self.open = False
            os.close(self.fd)


def _parse_results(data: bytes, nonce: str, n: int) -> tuple[list[bool], list[str | None], bool, str | None, bool, int]:
    passed = [False] * n
    errors: list[str | None] = ["NoResult"] * n
    loaded = finished = False
    load_error: str | None = "NoResult"
    forged = 0
    for line in data.decode("ascii", "replace").splitlines():
        parts = line.split(" ")
        if len(parts) != 4 or parts[0] != nonce:
            forged += 1
            continue
        _, index, ok, info = parts
        if index == "done":
            finished = True
        elif index == "-1":
            loaded = ok == "1"
            load_error = None if loaded else info
        elif index.isdigit() and int(index) < n:
            i = int(index)
            passed[i], errors[i] = ok == "1", (None if ok == "1" else info)
        else:
            forged += 1
    return passed, errors, loaded, load_error, finished, forged


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the leader is not reaped yet, so its pgid is still ours
    except (ProcessLookupError, PermissionError):
        pass


def _execute(program: str, setup: str, tests: list[str], config: SandboxConfig, isolation: Isolation) -> RunResult:
    limits = config.limits
    start = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="esreason-sandbox-")
    proc: subprocess.Popen | None = None
    streams: list[_Stream] = []
    try:
        if isolation.drop_to is not None:
            os.chown(workdir, *isolation.drop_to)
        nonce = secrets.token_hex(16)
        payload_path = os.path.join(workdir, f".payload-{secrets.token_hex(8)}.json")
        payload = {"nonce": nonce, "workdir": workdir, "program": program, "setup": setup, "tests": tests,
                   "rlimits": limits.rlimits(), "drop_to": isolation.drop_to, "guard": config.guard,
                   "test_timeout_s": limits.test_timeout_s}
        fd = os.open(payload_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(payload, f)
        result_r, result_w = os.pipe()
        try:
            proc = subprocess.Popen(_command(config, isolation, payload_path, result_w), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(result_w,),
                                    cwd=workdir, env=_env(workdir), start_new_session=True)
        except BaseException:
            os.close(result_r)
            raise
        finally:
            os.close(result_w)
        assert proc.stdout is not None and proc.stderr is not None
        results = _Stream(result_r, _RESULT_CAP)
        out = _Stream(os.dup(proc.stdout.fileno()), limits.output_bytes)
        err = _Stream(os.dup(proc.stderr.fileno()), limits.output_bytes)
        proc.stdout.close()
        proc.stderr.close()
        streams = [results, out, err]
        deadline = start + limits.timeout_s
        timed_out = _pump(streams, results, nonce, deadline)
        _kill_group(proc)
        returncode = proc.wait()
        passed, errors, loaded, load_error, finished, forged = _parse_results(bytes(results.data), nonce, len(tests))
        return RunResult(passed, errors, loaded, load_error, finished, timed_out and not finished, returncode,
                         out.data.decode("utf-8", "replace"), err.data.decode("utf-8", "replace"),
                         time.monotonic() - start, isolation.layers + (["audit guard"] if config.guard else []),
                         forged)
    finally:
        if proc is not None and proc.returncode is None:
            _kill_group(proc)
            proc.wait()
        for s in streams:
            s.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _pump(streams: list[_Stream], results: _Stream, nonce: str, deadline: float) -> bool:
    """Read all pipes until they close or the deadline passes; True when the deadline passed.

    Once the harness reports completion, stragglers holding the pipes get 0.5 s.
    """
    done_marker = f"{nonce} done ".encode()
    with selectors.DefaultSelector() as sel:
        for s in streams:
            sel.register(s.fd, selectors.EVENT_READ, s)
        while any(s.open for s in streams):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            for key, _ in sel.select(remaining):
                stream: _Stream = key.data
                if not stream.read():
                    sel.unregister(stream.fd)
                    stream.close()
            if done_marker in results.data:
                deadline = min(deadline, time.monotonic() + 0.5)
    return False


def run_tests(program: str, tests: list[str], setup: str = "", config: SandboxConfig | None = None) -> RunResult:
    """Run ``program`` then ``setup``, then each of ``tests`` separately, in the sandbox."""
    config = config or SandboxConfig()
    isolation = detect_isolation(config.namespaces, config.drop_privileges)
    return _execute(program, setup, list(tests), config, isolation)


def with_limits(config: SandboxConfig, **changes: float | int | None) -> SandboxConfig:
    """A copy of ``config`` with some limits changed (``with_limits(cfg, timeout_s=2)``)."""
    return replace(config, limits=replace(config.limits, **changes))
