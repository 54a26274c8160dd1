"""Harness executed inside the sandboxed interpreter (see :mod:`esreason.verifiers.sandbox`).

This file is *not imported* by esreason: the runner reads its source and passes it
to ``python -c``, so it must only use the standard library. Invocation::

    python -s -S -B -c <this source> <payload.json> <result fd>

Steps, in order: read and delete the payload file (program, setup code, tests,
limits, a random nonce); set the resource limits; when started as root, drop to the
unprivileged uid/gid given in the payload; install the audit-hook guard; point stdin
at /dev/null; execute the program, then the setup code, then each test separately
(each under its own ``SIGALRM`` timer), writing one record per test to the result
fd: ``<nonce> <index> <1|0> <error name>``. Records carry the nonce so that text
printed by the program, or written blindly to other descriptors, cannot pass for
results. Everything the harness needs after the program starts is bound to local
names first, so a program that rebinds ``os.write`` or ``builtins.exec`` does not
change how results are produced.
"""

import json
import os
import signal
import sys


class _TestTimeout(BaseException):
    """Raised by the per-test SIGALRM timer (a BaseException so `except Exception` does not swallow it)."""


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

#: audit events refused outright: processes, signals, sockets, foreign code.
_DENY = frozenset({
    "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty", "os.startfile",
    "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill", "os.setuid",
    "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
    "socket.getaddrinfo", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function",
    "sys.addaudithook", "resource.setrlimit", "resource.prlimit", "os.chroot",
})
#: audit events whose path arguments must stay inside the working directory.
_PATH_EVENTS = frozenset({
    "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link", "os.symlink",
    "os.truncate", "os.utime", "os.chflags", "os.lchflags", "os.mkfifo", "os.mknod", "shutil.rmtree",
    "shutil.move", "shutil.copyfile", "shutil.copytree", "shutil.copymode", "shutil.copystat",
    "shutil.chown", "shutil.make_archive", "shutil.unpack_archive", "tempfile.mkstemp", "tempfile.mkdtemp",
})
_DENY_IMPORTS = frozenset({"ctypes", "_ctypes", "_posixsubprocess", "_xxsubinterpreters", "cffi"})


def _install_guard(workdir):
    realpath, isinstance_, fspath = os.path.realpath, isinstance, os.fspath
    root = realpath(workdir)
    prefix = root + os.sep
    allowed_devices = frozenset({"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"})

    def inside(path):
        if isinstance_(path, int):
            return True  # an already-open descriptor (stdout, a file the program opened)
        try:
            p = realpath(fspath(path) if not isinstance_(path, bytes) else path.decode("utf-8", "replace"))
        except (TypeError, ValueError, OSError):
            return False
        return p == root or p.startswith(prefix) or p in allowed_devices

    def hook(event, args):
        if event in _DENY:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, 0))[:3]
            writing = (isinstance_(mode, str) and any(c in mode for c in "wax+")) or \
                (isinstance_(flags, int) and flags & _WRITE_FLAGS)
            if writing and not inside(path):
                raise PermissionError(f"sandbox: writing {path!r} outside the working directory")
        elif event in _PATH_EVENTS:
            for arg in args:
                if isinstance_(arg, (str, bytes, os.PathLike)) and not inside(arg):
                    raise PermissionError(f"sandbox: {event} on {arg!r} outside the working directory")
        elif event == "import" and args and args[0] in _DENY_IMPORTS:
            raise PermissionError(f"sandbox: importing {args[0]} is not allowed")

    sys.addaudithook(hook)


def _set_limits(limits):
    import resource

    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))


def _drop_privileges(uid, gid):
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def main():
    payload_path, result_fd = sys.argv[1], int(sys.argv[2])
    with open(payload_path, encoding="utf-8") as f:
        payload = json.load(f)
    os.remove(payload_path)
    nonce = payload["nonce"]
    workdir = payload["workdir"]
    write, compile_, exec_, monotonic = os.write, compile, exec, __import__("time").monotonic
    setitimer, ITIMER_REAL = signal.setitimer, signal.ITIMER_REAL

    def record(index, ok, err):
        err = "".join(ch if ch.isalnum() or ch in "_.:" else "_" for ch in err)[:80] or "-"
        write(result_fd, f"{nonce} {index} {1 if ok else 0} {err}\n".encode())

    def on_alarm(signum, frame):
        raise _TestTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.chdir(workdir)
    _set_limits(payload["rlimits"])
    if payload.get("drop_to") is not None and os.geteuid() == 0:
        _drop_privileges(*payload["drop_to"])
    if payload.get("guard", True):
        _install_guard(workdir)
    test_timeout = float(payload["test_timeout_s"])
    namespace = {"__name__": "solution", "__builtins__": __builtins__}

    def run(index, source, label):
        start = monotonic()
        try:
            code = compile_(source, label, "exec")
            setitimer(ITIMER_REAL, test_timeout)
            try:
                exec_(code, namespace)
            finally:
                setitimer(ITIMER_REAL, 0)
        except _TestTimeout:
            record(index, False, "Timeout")
            return False
        except BaseException as exc:  # the program's failure of any kind, SystemExit included
            record(index, False, type(exc).__name__)
            return False
        record(index, True, f"{monotonic() - start:.4f}")
        return True

    loaded = run(-1, payload["program"] + "\n\n" + payload.get("setup", ""), "<program>")
    for i, test in enumerate(payload["tests"]):
        if loaded:
            run(i, test, f"<test {i}>")
        else:
            record(i, False, "ProgramFailed")
    write(result_fd, f"{nonce} done 1 -\n".encode())
    try:  # keep what the program printed (capped by the runner); a hostile stream gets one timer
        setitimer(ITIMER_REAL, test_timeout)
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - whatever the program left in sys.stdout
        pass
    os._exit(0)  # skip interpreter teardown: atexit handlers and finalizers the program registered


main()
