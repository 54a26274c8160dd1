"""The ES core (paper appendix "Implementation Procedure"): pure tensor code, no backends.

- :mod:`~esreason.es.noise` — eps(seed, tensor name), drawn on the weights' device, block by block.
- :mod:`~esreason.es.cache` — one update's directions, kept so the update need not redraw them.
- :mod:`~esreason.es.population` — who is in the population: seeds and signs (one/two-point).
- :mod:`~esreason.es.shaping` — z-score / none / rank reward shaping.
- :mod:`~esreason.es.update` — alpha/N sum_i w_i eps_i, accumulated in fp32 per block.
- :mod:`~esreason.es.sharded` — the sharded update: per-shard sums added exactly in int64 fixed point.
- :mod:`~esreason.es.apply` — perturb / subtract / copy / update of one tensor on its device (HF and vLLM).
- :mod:`~esreason.es.params` — perturb / exact restore / update of a module's parameters.
- :mod:`~esreason.es.lowrank` — EGGROLL low-rank directions.
- :mod:`~esreason.es.schedule` — the keep-tail mini-batch schedule.

These modules import only torch, numpy, the standard library, each other and
:mod:`esreason.errors`. The loop that uses them is :mod:`esreason.es_loop`.
"""
