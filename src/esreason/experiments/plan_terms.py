"""The per-update work terms of ``esreason experiment plan``: what the code, TRL 1.16 and
vLLM do in one update, priced with :mod:`esreason.experiments.plan_table`.

- **decode** (:func:`step_s`, :func:`call_s`): a vLLM decode step reads the bf16 weights once and
  the KV cache of every running row (its prompt and the tokens so far), at the HBM efficiency of
  the ``vllm64`` rate, and takes at least the host floor (``decode_step_floor_s``); rows with their
  own seed add one sampler iteration each (``seeded_row_us``). A synchronous call of n rows runs
  until its longest row ends: the steps are integrated over the rows still running (the length
  distribution's survival; :mod:`esreason.experiments.lengths`).
- **GRPO train** (:func:`grpo_train_s`): TRL pads one process's whole rollout, prompt included, to
  its longest completion and trains it in micro-batches without trimming; the forwards it runs
  (:func:`esreason.grpo.plan.trl_forwards`) at the measured cost per padded token and forward.
- **GRPO rollout extras** (:func:`grpo_reload_s`): the weight push before every rollout, and vLLM's
  sleep and wake when ``grpo.vllm_sleep`` is on.
- **checksum** (:func:`checksum_rate`): an engine's checksum threads each on their own core.

The functions take the plan's context (``plan._Ctx``: ``params``, ``gpu``, ``const``, ``note``,
``lengths_model``) and plain numbers, so the tests can vary one input at a time.
"""

from __future__ import annotations

from typing import Any

from esreason.experiments import plan_table as tab

#: Parameters of the model the H100 constants were measured at (Qwen2.5-1.5B shapes; gpucheck.json).
MEASURED_PARAMS = 1_543_714_304
#: Hashing threads per engine: esreason.backends.engine.CHECKSUM_THREADS (not imported: backends
#: load torch; tests/test_plan_terms.py checks they agree).
CHECKSUM_THREADS = 8
#: Midpoints of the decode-step integral of a call (the plan's other uncertainties are far larger).
CALL_STEPS = 200


def kv_bytes_per_token(model: str, params: float) -> tuple[float, str]:
    """bf16 KV-cache bytes of one token, 2 (K, V) x layers x KV heads x head dim x 2 bytes, from the
    model's architecture (:mod:`esreason.io.architectures`); without one, Qwen2.5-1.5B's
    28,672 bytes scaled by parameters. Returns (bytes, how)."""
    from esreason.errors import UserError
    from esreason.io.architectures import architecture

    try:
        arch = architecture(model)
        heads = int(arch["num_attention_heads"])
        head_dim = int(arch.get("head_dim") or int(arch["hidden_size"]) // heads)
        kv = 2 * int(arch["num_hidden_layers"]) * int(arch.get("num_key_value_heads") or heads) * head_dim * 2
        return float(kv), f"{model}'s config.json: 2 x layers x KV heads x head dim x 2 bytes"
    except (UserError, KeyError, ValueError):
        return 28_672.0 * params / MEASURED_PARAMS, "Qwen2.5-1.5B's 28,672 bytes scaled by parameters (no architecture)"


def step_s(ctx: Any, rows: float, context: float, seeded: bool, tp: int = 1, share: float = 1.0) -> float:
    """Seconds of one vLLM decode step of ``rows`` rows of ``context`` tokens each: max(host floor,
    (bf16 weights + the rows' KV cache) / (HBM x DECODE_EFFICIENCY)) + a sampler iteration per seeded
    row (vLLM V1 ``random_sample`` loops over requests with their own generator). ``tp`` > 1: each GPU
    of the engine reads its shard of the weights and of the KV cache (the all-reduces are a term of
    their own: :func:`esreason.experiments.plan_tp.allreduce_s`).

    ``share`` > 1: that many engines decode on the GPU at once (``backend.engines_per_gpu``, each
    with rows like these). Each engine's host work (the floor) runs in its own process beside the
    others', while the GPU serves their reads one after another at ``shared_read_efficiency`` of its
    bandwidth, so the step is at least ``share`` x (weights + KV) / (HBM x that efficiency): sharing
    fills the time a step waits on its host floor. Members of a full-rank population each have their
    own weights, so K engines read K copies per step where plain inference reads one. A model (ours),
    not measured on a GPU."""
    hbm = ctx.gpu["hbm_bytes_per_s"] * tab.DECODE_EFFICIENCY
    read = 2.0 * ctx.params + rows * context * ctx.kv_bytes
    if tp > 1:
        from esreason.experiments import plan_tp

        model = ctx.spec.model
        read = 2.0 * plan_tp.layout(model, tp)["held"] + rows * context * ctx.kv_bytes / plan_tp.kv_split(model, tp)
    step = max(ctx.const("decode_step_floor_s"), read / hbm)
    if share > 1:
        step = max(step, share * read / (ctx.gpu["hbm_bytes_per_s"] * ctx.const("shared_read_efficiency")))
    return step + (rows * ctx.const("seeded_row_us") * 1e-6 if seeded else 0.0)


def call_s(ctx: Any, rows: int, prompt: float, cap: int, longest_of: int, seeded: bool,
           tp: int = 1, engines_per_gpu: int = 1) -> tuple[float, float]:
    """(decode, tail) seconds of one synchronous call of ``rows`` rows that waits for the longest of
    ``longest_of`` responses (>= rows: GRPO's processes, or the engines of an ES update's last round,
    wait for each other).

    The call runs E[longest of ``longest_of``] steps; at step t the rows still running are
    rows x P(length > t) (at least one) with prompt + t tokens of context each. ``decode`` is the
    same call if every row had the mean length (mean steps of the full batch at the mean context);
    ``tail`` is the rest, the wait for the long rows. ``engines_per_gpu`` = K > 1: the call's engine
    shares its GPU with K - 1 others running calls like it; at step t another engine is still
    decoding while its own longest row runs, P(longest of ``rows`` > t), and :func:`step_s` is
    priced with the engines decoding at that step.
    """
    dist = ctx.lengths_model()
    steps = ctx.longest(longest_of, cap)
    mean = ctx.length(cap)
    dt = steps / CALL_STEPS
    total = 0.0
    for i in range(CALL_STEPS):
        t = (i + 0.5) * dt
        alive = dist.survival(t, float(cap))
        running = max(1.0, rows * alive)
        share = 1.0 + (engines_per_gpu - 1) * (1.0 - (1.0 - alive) ** rows)
        total += step_s(ctx, running, prompt + t, seeded, tp, share) * dt
    decode = mean * step_s(ctx, rows, prompt + mean / 2, seeded, tp, float(engines_per_gpu))
    return decode, max(0.0, total - decode)


def es_calls_s(ctx: Any, members: int, rows: int, engines: int, prompt: float, cap: int, seeded: bool,
               tp: int = 1, engines_per_gpu: int = 1) -> tuple[float, float]:
    """(decode, tail) seconds of one ES update's generation on a pool of ``engines`` engines, each
    running ``members`` member calls of ``rows`` rows one after another (the pool hands the next
    member to whichever engine is free: backends.ray_pool ``evaluate``). The first ``members - 1``
    calls each wait for their own longest row; the update waits for every engine, so the last round
    waits for the longest of its ``rows x engines`` responses."""
    decode, tail = call_s(ctx, rows, prompt, cap, rows * engines, seeded, tp, engines_per_gpu)
    if members > 1:
        d, t = call_s(ctx, rows, prompt, cap, rows, seeded, tp, engines_per_gpu)
        decode, tail = decode + (members - 1) * d, tail + (members - 1) * t
    return decode, tail


def forward_token_s(ctx: Any) -> float:
    """Seconds of one forward over one padded token in TRL's training (bf16 autocast): the H100
    measurement (``grpo_forward_token_us``, 5 forward-equivalents per token at 1.54B) scaled by
    parameters and by the GPU's dense bf16 peak (FLOPs per token are 2 P per forward)."""
    us = ctx.const("grpo_forward_token_us")
    return us * 1e-6 * (ctx.params / MEASURED_PARAMS) * (tab.GPUS["h100"]["bf16_flops"] / ctx.gpu["bf16_flops"])


def grpo_train_s(sequences: int, prompt: float, longest: float, forwards: int, per_token_s: float) -> float:
    """Seconds of one update's GRPO training on the slowest process.

    TRL pads a process's rollout (``sequences`` = B x G / P rows) to its longest prompt (left) and
    its longest completion (right) (``GRPOTrainer._generate_and_score_completions``: ``pad(...)``,
    ``pad_to_multiple_of`` None in build_trl_args), then ``split_tensor_dict`` cuts it into
    ``steps_per_generation`` micro-batches with that width (``_prepare_inputs``); every forward TRL
    runs (:func:`esreason.grpo.plan.trl_forwards`) covers all ``sequences x (prompt + longest)``
    padded tokens. DDP (and FSDP) synchronise every optimizer step, so the update takes as long as
    the process with the longest completion: ``longest`` is the longest of all B x G responses.
    """
    return sequences * (prompt + longest) * forwards * per_token_s


def grpo_reload_s(ctx: Any, layers: int, sleep: bool) -> float:
    """Seconds per update of TRL's weight push into the colocated engine (every rollout after an
    optimizer step: ``GRPOTrainer._generate_single_turn`` calls ``sync_weights`` when ``global_step``
    moved), one ``load_weights`` per tensor (~12 per layer + 3), plus sleep and wake with
    ``vllm_sleep`` (``vllm_sleep_wake_s``)."""
    reload = (12 * layers + 3) * ctx.const("weight_reload_tensor_ms") * 1e-3
    return reload + (ctx.const("vllm_sleep_wake_s") if sleep else 0.0)


def layers_of(model: str, params: float) -> int:
    """Decoder layers of ``model`` (its architecture), else 28 (the paper's models all have 28)."""
    from esreason.errors import UserError
    from esreason.io.architectures import architecture

    try:
        return int(architecture(model)["num_hidden_layers"])
    except (UserError, KeyError, ValueError):
        return 28


def checksum_rate(ctx: Any, engines_on_node: int) -> float:
    """Bytes/s one engine hashes: its ``CHECKSUM_THREADS`` threads (backends/engine.py
    ``tensors_checksum``) at the per-core rate, each on a core of its own while the node's cores
    last (``node_cores`` / engines)."""
    threads = CHECKSUM_THREADS
    cores = ctx.over("node_cores") / max(1, engines_on_node)
    return ctx.over("hash_bytes_per_s_per_core") * max(1.0, min(float(threads), cores))


def es_noise_s(ctx: Any, members: int, summed: int) -> float:
    """Seconds of one engine's ES noise work per update at the measured H100 costs (``es_member_s``:
    perturb + restore per member; ``es_update_s``: summing up to 8 members' directions and applying
    the update; members beyond 8 at the cost model's 16 bytes per parameter), scaled by parameters
    and HBM bandwidth."""
    scale = (ctx.params / MEASURED_PARAMS) * (tab.GPUS["h100"]["hbm_bytes_per_s"] / ctx.gpu["hbm_bytes_per_s"])
    extra = max(0, summed - 8) * ctx.hbm_seconds(16)
    return (members * ctx.const("es_member_s") + ctx.const("es_update_s")) * scale + extra


__all__ = ["call_s", "checksum_rate", "es_calls_s", "es_noise_s", "forward_token_s", "grpo_reload_s", "grpo_train_s",
           "kv_bytes_per_token", "layers_of", "step_s"]
