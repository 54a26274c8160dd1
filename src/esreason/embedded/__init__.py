"""The embedded default: a tiny character-level Qwen2 model shipped with the package (DESIGN §4)."""

from esreason.embedded.model import TinyArch, build_model, demo_model_dir
from esreason.embedded.tokenizer import build_tokenizer, safe_decode

__all__ = ["TinyArch", "build_model", "build_tokenizer", "demo_model_dir", "safe_decode"]
