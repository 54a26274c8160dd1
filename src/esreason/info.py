"""``esreason info``: versions, device and where the embedded default lives."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys


def _version(name: str) -> str:
    import importlib.metadata as md

    if importlib.util.find_spec(name.replace("-", "_")) is None:
        return "not installed"
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "not installed"


def info_text() -> str:
    import torch

    from esreason import __version__
    from esreason.embedded import demo_model_dir

    lines = [f"esreason      {__version__}",
             f"python        {sys.version.split()[0]} ({platform.platform()})",
             f"torch         {torch.__version__}"]
    for lib in ("transformers", "trl", "math-verify", "datasets", "vllm", "ray"):
        lines.append(f"{lib:<13} {_version(lib)}")
    if torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        lines.append(f"device        cuda ({names})")
    else:
        lines.append(f"device        cpu ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)")
    demo = demo_model_dir()
    cfg = demo / "config.json"
    if cfg.is_file():
        c = json.loads(cfg.read_text())
        lines.append(f"embedded      {demo}  ({c.get('model_type')}, hidden {c.get('hidden_size')}, "
                     f"{c.get('num_hidden_layers')} layers, vocab {c.get('vocab_size')})")
    else:
        lines.append(f"embedded      {demo}  (missing: run `esreason pretrain-demo`)")
    return "\n".join(lines)


def run_info(args: argparse.Namespace | None = None) -> int:
    print(info_text())
    return 0
