"""Off-task drift and retention (docs/offtask.md): how far each method's next-token distribution moved
from the base model's on text outside training.

- :mod:`~esreason.analysis.offtask.settings` — the experiment's ``analysis.offtask`` section;
- :mod:`~esreason.analysis.offtask.data` — the off-task set (the base model's samples, a file, a hub dataset);
- :mod:`~esreason.analysis.offtask.run` — the token KL(base || tuned) of every method, written beside
  the experiment's evaluations (the report's drift table and gain-vs-forgetting figure read it).
"""
