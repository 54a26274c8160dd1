"""esreason: Evolution Strategies post-training for LLM reasoning.

Implements the system of "Understanding Evolution Strategies for LLM Reasoning:
Broader Reasoning Coverage than GRPO": full-parameter one-point ES with seeded
perturbations and z-scored rewards, a FLOP-matched GRPO comparator, a Pass@K /
Maj@K evaluation harness and analyses of what ES does to the weights.
"""

__version__ = "0.1.0"
