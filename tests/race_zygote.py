"""The zygote of tests/concurrency_helpers.py: import once, then per round fork one child per
command, release them together through one pipe (EOF reaches every child at once), wait, and
print the exit statuses as JSON (one list per round). Each child's stdout/stderr go to
WORK/r<round>-<child>.out/.err."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def _lock_body(directory: str, hold: float) -> int:
    """The lock primitive alone: take the lock, record this writer, hold it; 2 and one line when refused.

    The holder keeps the lock until the other child has been refused (it leaves ``DIRECTORY.refused``
    beside the directory), at most ``hold`` seconds: the pair overlaps however late a loaded machine
    schedules the second child, so the outcome never depends on timing."""
    from esreason.errors import DirectoryLocked
    from esreason.io.lock import directory_lock

    refused = directory.rstrip("/") + ".refused"
    try:
        with directory_lock(directory, what="test directory"):
            with open(os.path.join(directory, "writers.log"), "a") as fh:
                fh.write(f"{os.getpid()}\n")
            deadline = time.monotonic() + hold
            while not os.path.exists(refused) and time.monotonic() < deadline:
                time.sleep(0.01)
    except DirectoryLocked as exc:
        print(f"esreason: error: {exc}", file=sys.stderr)
        open(refused, "w").close()
        return 2
    return 0


def _child(argv: list[str], go_read: int, out_path: str, err_path: str) -> None:
    for fd, path in ((1, out_path), (2, err_path)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    os.read(go_read, 1)  # the barrier: returns (EOF) when the zygote closes the write end
    rc = 1
    try:
        if argv[0] == "__lock__":
            rc = _lock_body(argv[1], float(argv[2]))
        else:
            from esreason.cli import main

            rc = main(argv)
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - a child must report and exit, never return into the zygote
        traceback.print_exc()
        rc = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
    work = spec["work"]
    if spec["heavy"]:
        import torch  # noqa: F401
        import transformers  # noqa: F401

        import esreason.cli  # noqa: F401
        import esreason.es_loop.run  # noqa: F401
        import esreason.eval.harness  # noqa: F401
        import esreason.experiments.runner  # noqa: F401
    else:
        import esreason.io.lock  # noqa: F401
    codes = []
    for i, argvs in enumerate(spec["rounds"]):
        go_read, go_write = os.pipe()
        pids = []
        for j, argv in enumerate(argvs):
            pid = os.fork()
            if pid == 0:
                os.close(go_write)
                _child(argv, go_read, os.path.join(work, f"r{i}-{j}.out"), os.path.join(work, f"r{i}-{j}.err"))
            pids.append(pid)
        os.close(go_read)
        time.sleep(0.05)  # every child reaches its read (it is released by EOF either way)
        os.close(go_write)  # the barrier opens for all children at once
        codes.append([os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids])
    print(json.dumps(codes))


if __name__ == "__main__":
    main()
