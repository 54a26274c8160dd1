"""A small pool of math-verify worker processes with a per-call deadline.

Why a pool at all: math-verify bounds ``parse`` and ``verify`` with ``signal.alarm``,
which only works in a process's main thread (``parse`` raises ``ValueError``
elsewhere), and sympy can still run for a very long time on hostile LaTeX
(``10^{10^{10}}``). Every math-verify call therefore runs in a worker process's
main thread, and the caller waits at most ``timeout_s``; a worker that misses the
deadline or dies is killed (SIGKILL) and replaced by a fresh one on the next call.

Deviation from a ``concurrent.futures.ProcessPoolExecutor``: on Python 3.10/3.11
the executor has no public way to kill one hung worker (``shutdown`` leaves it
running, burning a core), and its ``spawn``/``forkserver`` contexts re-import the
caller's ``__main__`` module in every worker (which breaks scripts without an
``if __name__ == "__main__"`` guard, stdin scripts and notebooks); ``fork`` is unsafe
after torch has started threads. So each worker is a plain ``subprocess`` running
:mod:`esreason.verifiers.mathworker` with the caller's ``sys.path``; requests and
replies are JSON lines on a private pipe pair (stdout/stderr go to /dev/null, so
nothing math-verify or sympy prints can corrupt the protocol). Any thread may call
:meth:`MathVerifyPool.compare`; up to ``size`` calls run at once.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

#: Seconds a call may take before its worker is killed (math-verify's own internal
#: limits inside the worker are 3 s for each parse and 3 s for verify).
DEFAULT_TIMEOUT_S = 10.0
#: Seconds a new worker may take to import math-verify and report ready.
STARTUP_TIMEOUT_S = 120.0
#: Address-space limit of a worker (sympy on hostile input must not eat the machine).
WORKER_MEMORY_BYTES = 4 * 1024**3

_BOOT = (
    "import json, sys\n"
    "sys.path[:] = json.loads(sys.argv[1])\n"
    "from esreason.verifiers.mathworker import main\n"
    "main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))\n"
)


@dataclass(frozen=True)
class Outcome:
    """Result of one comparison: status is "equal", "different", "timeout" or "error"."""

    status: str
    detail: str = ""

    @property
    def equal(self) -> bool:
        return self.status == "equal"


class _Worker:
    """One worker process and its request/reply pipes."""

    def __init__(self, memory_bytes: int) -> None:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        paths = [p for p in sys.path if p and os.path.isabs(p)]
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _BOOT, json.dumps(paths), str(req_r), str(rep_w), str(memory_bytes)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(req_r, rep_w), cwd="/", start_new_session=True)
        finally:
            os.close(req_r)
            os.close(rep_w)
        self._req = req_w
        self._rep = rep_r
        self._buf = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, message: dict) -> None:
        data = (json.dumps(message) + "\n").encode()
        view = memoryview(data)
        while view:
            written = os.write(self._req, view)
            view = view[written:]

    def receive(self, deadline: float) -> dict | None:
        """Next reply, or None when the deadline passes; EOFError when the worker closed its pipe (died)."""
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([self._rep], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(self._rep, 65536)
            if not chunk:
                raise EOFError("math-verify worker closed its pipe")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def kill(self) -> None:
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        self.proc.wait()
        for fd in (self._req, self._rep):
            try:
                os.close(fd)
            except OSError:
                pass


class MathVerifyPool:
    """Up to ``size`` math-verify workers, started lazily, shared by all threads."""

    def __init__(self, size: int = 2, memory_bytes: int = WORKER_MEMORY_BYTES) -> None:
        if size < 1:
            raise ValueError("pool size must be >= 1")
        self.size = size
        self.memory_bytes = memory_bytes
        self._slots = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self.restarts = 0  # workers killed after a timeout or death (for diagnostics and tests)
        self.owner_pid = os.getpid()  # a forked child must not share these pipes

    def _start(self) -> _Worker:
        worker = _Worker(self.memory_bytes)
        with self._lock:
            self._all.add(worker)
        try:
            reply = worker.receive(time.monotonic() + STARTUP_TIMEOUT_S)
        except EOFError:
            reply = None
        if not reply or not reply.get("ready"):
            self._discard(worker)
            raise RuntimeError("the math-verify worker failed to start; is math-verify installed "
                               f"for {sys.executable}? (reply: {reply!r})")
        return worker

    def _discard(self, worker: _Worker) -> None:
        with self._lock:
            self._all.discard(worker)
        worker.kill()

    def compare(self, gold: str, pred: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Outcome:
        """math-verify ``verify(parse(gold), parse(pred))`` in a worker, within ``timeout_s``.

        A worker that died before answering is replaced and the call retried once (the
        death may be unrelated to this input); a timeout is not retried.
        """
        with self._slots:
            for attempt in range(2):
                with self._lock:
                    worker = self._idle.pop() if self._idle else None
                if worker is None:
                    worker = self._start()
                died = False
                try:
                    worker.send({"gold": gold, "pred": pred})
                    reply = worker.receive(time.monotonic() + timeout_s)
                except (OSError, EOFError):  # broken pipe / closed pipe: the worker died
                    reply, died = None, True
                if reply is not None:
                    with self._lock:
                        self._idle.append(worker)
                    return Outcome(reply["status"], reply.get("detail", ""))
                self._discard(worker)
                self.restarts += 1
                if not died:
                    return Outcome("timeout", f"no answer within {timeout_s:g} s")
            return Outcome("error", "math-verify worker died")

    def worker_pids(self) -> list[int]:
        with self._lock:
            return [w.pid for w in self._all]

    def close(self) -> None:
        """Kill every worker (idle ones; busy ones are killed when their call returns)."""
        with self._lock:
            workers, self._idle = self._idle, []
            for w in workers:
                self._all.discard(w)
        for w in workers:
            w.kill()


_POOL: MathVerifyPool | None = None
_POOL_LOCK = threading.Lock()


def shared_pool() -> MathVerifyPool:
    """The process-wide pool used by the math verifier (created on first use, and anew after a fork)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.owner_pid != os.getpid():  # first use, or we are a forked child
            _POOL = MathVerifyPool(size=max(1, min(2, os.cpu_count() or 1)))
            atexit.register(_POOL.close)
        return _POOL
