"""Weight analyses of checkpoint pairs (paper §RQ2 and the restore ablation; docs/analysis.md).

- :mod:`~esreason.analysis.weights.checkpoints`: streaming paired tensor access over
  safetensors, the tied-weight rule, a streaming safetensors writer;
- :mod:`~esreason.analysis.weights.scan` / :mod:`~esreason.analysis.weights.pair`: one pass
  feeding every statistic;
- :mod:`~esreason.analysis.weights.drift`: relative L2 distance, s_tau, thresholded distances, breakdowns;
- :mod:`~esreason.analysis.weights.threshold`: magnitude-thresholded checkpoints and the Pass@1 sweep;
- :mod:`~esreason.analysis.weights.localize` / :mod:`~esreason.analysis.weights.categories`: the largest updates;
- :mod:`~esreason.analysis.weights.rounding`: ulp attribution of low-precision changes;
- :mod:`~esreason.analysis.weights.ablation`: subtract-to-restore vs exact restore, same seeds;
- :mod:`~esreason.analysis.weights.reports` / :mod:`~esreason.analysis.weights.plots`: their
  tables, payloads and figures; :mod:`~esreason.analysis.weights.command`: the sub-commands.

Nothing is imported here, so ``import esreason.analysis.weights`` stays cheap.
"""
