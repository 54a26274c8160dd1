"""The Python API: ES training and Pass@K evaluation of a user's model, data and reward, in TRL's shape.

``from esreason import ESConfig, ESTrainer, evaluate`` (docs/custom-tasks.md walks through it;
docs/api.md is the reference, the text ``help()`` shows).
"""

from esreason.api.config import FIELD_KEYS, ESConfig
from esreason.api.evaluate import evaluate
from esreason.api.grpo import GRPOComparator
from esreason.api.trainer import ESTrainer
from esreason.docstrings import document

# help() shows each parameter's type, default and meaning (esreason.docstrings)
document(ESConfig, ESTrainer, GRPOComparator, evaluate, keys=lambda obj: FIELD_KEYS if obj is ESConfig else None)

__all__ = ["ESConfig", "ESTrainer", "GRPOComparator", "evaluate"]
