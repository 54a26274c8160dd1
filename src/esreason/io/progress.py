"""Progress bars (tqdm). Shown on a terminal; off when stderr is not a TTY unless
ESREASON_PROGRESS=1 (so CI logs and pipes stay clean)."""

from __future__ import annotations

import os
import sys
from typing import Any


def progress_bar(total: int | None, desc: str, disable: bool | None = None, **kw: Any):
    from tqdm.auto import tqdm

    if disable is None:
        disable = not (sys.stderr.isatty() or os.environ.get("ESREASON_PROGRESS") == "1")
    return tqdm(total=total, desc=desc, disable=disable, dynamic_ncols=True, **kw)
