"""The Python API: ES training and Pass@K evaluation of a user's model, data and reward, in TRL's shape.

``from esreason import ESConfig, ESTrainer, evaluate`` (docs/custom-tasks.md walks through it).
"""

from esreason.api.config import ESConfig
from esreason.api.evaluate import evaluate
from esreason.api.grpo import GRPOComparator
from esreason.api.trainer import ESTrainer

__all__ = ["ESConfig", "ESTrainer", "GRPOComparator", "evaluate"]
