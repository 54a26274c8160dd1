"""Progress bars for long commands (steps, rewards, ETA; DESIGN §1), via tqdm.

Shown when stderr is a terminal. Off otherwise (pipes, CI logs, notebooks), so logs are
not flooded with carriage-return redraws. Override with the environment variable
``ESREASON_PROGRESS``: ``1`` forces bars on, ``0`` forces them off. An explicit
``disable=True/False`` argument wins over both.

Usage::

    bar = progress_bar(total=steps, desc="ES")
    for step in range(steps):
        ...
        bar.update(1)
        bar.set_postfix(reward=f"{reward:.3f}", acc=f"{acc:.3f}")
    bar.close()
"""

from __future__ import annotations

import os
import sys
from typing import Any

ENV_VAR = "ESREASON_PROGRESS"


def progress_enabled() -> bool:
    """Whether bars are shown by default: ESREASON_PROGRESS=1/0 if set, else stderr is a TTY."""
    env = os.environ.get(ENV_VAR, "").strip()
    if env in ("0", "1"):
        return env == "1"
    stream = sys.stderr
    return stream is not None and hasattr(stream, "isatty") and stream.isatty()


def progress_bar(total: int | None, desc: str, disable: bool | None = None, **kwargs: Any) -> Any:
    """A ``tqdm`` bar on stderr; ``disable=None`` means "decide by :func:`progress_enabled`".

    Extra keyword arguments go to ``tqdm`` (e.g. ``initial=start_step`` when resuming).
    """
    from tqdm import tqdm

    if disable is None:
        disable = not progress_enabled()
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(total=total, desc=desc, disable=disable, **kwargs)


__all__ = ["ENV_VAR", "progress_bar", "progress_enabled"]
