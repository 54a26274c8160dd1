"""Coverage analyses (paper §RQ1 theory; docs/coverage.md) — ``esreason analyze coverage|lemma1``.

- :mod:`~esreason.analysis.coverage.report`: the ``coverage/...`` rows of a run's metrics and
  their tables (Lemmas 2-3 diagnostics, Proposition 1);
- :mod:`~esreason.analysis.coverage.divergence`: the estimators of the Lemma 1 check (policy
  JS divergence, Fisher trace);
- :mod:`~esreason.analysis.coverage.lemma1`: the Lemma 1 check over a sigma grid and its table;
- :mod:`~esreason.analysis.coverage.plots`: the figures of both;
- :mod:`~esreason.analysis.coverage.command`: the ``coverage`` and ``lemma1`` sub-commands.

The diagnostics computed during training are :mod:`esreason.es_loop.coverage`. Nothing is
imported here, so importing a submodule does not load torch.
"""
