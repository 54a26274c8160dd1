"""Weight analyses of checkpoint pairs (paper §RQ2) — ``esreason analyze``.

- :mod:`~esreason.analysis.checkpoints`: streaming paired tensor access over safetensors,
  the tied-weight rule, a streaming safetensors writer.
- :mod:`~esreason.analysis.scan` / :mod:`~esreason.analysis.pair`: one pass feeding the statistics.
- :mod:`~esreason.analysis.drift`: relative L2 distance, s_tau, thresholded distances, breakdowns.
- :mod:`~esreason.analysis.threshold`: magnitude-thresholded checkpoints and the Pass@1 sweep.
- :mod:`~esreason.analysis.localize` / :mod:`~esreason.analysis.categories`: the largest updates.
- :mod:`~esreason.analysis.rounding`: ulp attribution of low-precision changes.
- :mod:`~esreason.analysis.ablation`: subtract-to-restore vs exact restore, same seeds.
- :mod:`~esreason.analysis.tables`, :mod:`~esreason.analysis.plots`, :mod:`~esreason.analysis.reports`:
  Markdown/LaTeX/JSON tables and PNG figures; :mod:`~esreason.analysis.command`: the CLI.

Modules import torch; nothing is imported here so ``import esreason.analysis`` stays cheap.
"""
