"""Analyses behind ``esreason analyze`` — one subpackage per analysis, shared output modules at the top.

- :mod:`esreason.analysis.weights`: checkpoint-pair weight analyses (paper §RQ2): drift,
  s_tau, thresholding, localisation, rounding attribution, the restore ablation (docs/analysis.md);
- :mod:`esreason.analysis.estimator`: the one- vs two-point local perturbation diagnostic
  (paper appendix "ES–ZO Estimator Equivalence"; docs/estimator.md);
- :mod:`esreason.analysis.coverage`: population coverage diagnostics of a run and the
  numerical check of Lemma 1 (paper §RQ1 theory; docs/coverage.md);
- :mod:`esreason.analysis.offtask`: off-task token KL from the base model of an experiment's methods
  (docs/offtask.md; run by ``esreason experiment run`` when the experiment names ``analysis.offtask``);
- shared: :mod:`~esreason.analysis.tables` (Markdown/LaTeX/JSON tables and files),
  :mod:`~esreason.analysis.figures` (matplotlib backend, atomic PNG writes),
  :mod:`~esreason.analysis.output` (what a command prints), :mod:`~esreason.analysis.command`
  (the ``analyze`` parser; each subpackage adds its sub-commands).

Dependencies point one way: command -> subpackages -> shared modules; subpackages do not
import each other. Modules import torch; nothing is imported here so
``import esreason.analysis`` stays cheap.
"""
