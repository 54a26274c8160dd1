"""The ES core (paper appendix "Implementation Procedure"): pure tensor code, no backends.

- :mod:`~esreason.es.noise` — eps(seed, tensor name), drawn on the weights' device.
- :mod:`~esreason.es.population` — who is in the population: seeds and signs (one/two-point).
- :mod:`~esreason.es.shaping` — z-score / none / rank reward shaping.
- :mod:`~esreason.es.update` — theta += alpha/N sum_i w_i eps_i, fp32, one bounded pass.
- :mod:`~esreason.es.params` — perturb / exact restore / update of a module's parameters.
- :mod:`~esreason.es.lowrank` — EGGROLL low-rank directions.
- :mod:`~esreason.es.schedule` — the keep-tail mini-batch schedule.

These modules import only torch, numpy, the standard library, each other and
:mod:`esreason.errors`. The loop that uses them is :mod:`esreason.es_loop`.
"""
