"""The ES training loop: it sits above the ES core (:mod:`esreason.es`) and the backends.

- :mod:`~esreason.es_loop.trainer` — the loop: schedule -> seeds -> evaluate population ->
  shape -> update -> log / checkpoint (orchestration only).
- :mod:`~esreason.es_loop.run` — build a run from a config (model, task, backend), resume.
- :mod:`~esreason.es_loop.evaluate` — the sequential reference population evaluator.
- :mod:`~esreason.es_loop.select` — ``backend.type`` -> population evaluator.
- :mod:`~esreason.es_loop.coverage` — the optional per-member coverage probe.

The update itself (directions, shaping, the centre update, exact restore) is the core in
:mod:`esreason.es`, which imports nothing from this package or from the backends.
"""
