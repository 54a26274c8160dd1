"""Every key a user can set, generated from the code, and the tests that exercise each (not a test module).

:func:`documented_keys` lists, as ``"<where>:<key>"``:

- ``es:`` / ``grpo:`` every dotted key of the ES and GRPO run configs (the dataclasses the loaders
  build), ``sequence:`` / ``experiment:`` / ``sweep:`` every key of those files (the dataclasses
  docs/config.md is written from);
- ``ESConfig:`` every field of the flat Python config;
- ``taskfile:`` every key of a task file (:mod:`esreason.tasks.datafile`'s known-key lists; the
  ``prompt`` and ``dataset`` mappings by their own keys);
- ``ESTrainer:``, ``ESTrainer.train:``, ``ESTrainer.save_model:``, ``GRPOComparator:``,
  ``GRPOComparator.train:`` and ``evaluate:`` every parameter of the Python API's entry points
  (``inspect.signature``).

:data:`EXERCISED` maps each test (``file::function``) to the keys it sets to a valid non-default
value and checks the effect of (or, where the effect needs a GPU or Ray, checks the value reaching
the object that uses it). An ``ESConfig`` field that stands for a YAML key is exercised by
tests/test_keys_api.py (the field reaches that key of the run config) together with the key's own
tests. tests/test_documented_keys.py fails when a key has no test, when a test named here does not
exist, and when a key named here is no longer a key: a new key needs a test, registered here.
"""

from __future__ import annotations

import dataclasses
import inspect

#: The test that takes each flat ESConfig field to its YAML key (the field's effect is the key's).
FLAT_FIELD_TEST = "test_keys_api.py::test_each_flat_field_reaches_the_run_config"


def _file_keys() -> dict[str, list[str]]:
    from esreason import config_docs

    out = {}
    for f in config_docs.documented_files():
        prefix = "sweep." if f.name == "Sweep" else ""
        keys = [k.key for k in config_docs.leaf_keys(f.cls, prefix)]
        keys += [k.key for p, sec in config_docs.sections(f.cls) for k in config_docs.leaf_keys(sec, prefix + p + ".")]
        out[f.name.lower()] = keys
    return out


def _api_entry_points() -> dict[str, object]:
    from esreason import ESTrainer, GRPOComparator, evaluate

    return {"ESTrainer": ESTrainer, "ESTrainer.train": ESTrainer.train, "ESTrainer.save_model": ESTrainer.save_model,
            "GRPOComparator": GRPOComparator, "GRPOComparator.train": GRPOComparator.train, "evaluate": evaluate}


def documented_keys() -> set[str]:
    """Every key a user can set (see the module docstring)."""
    from esreason.api.config import ESConfig, yaml_keys
    from esreason.config import RunConfig
    from esreason.grpo.config import GRPORunConfig
    from esreason.tasks import datafile

    keys = {f"es:{k}" for k in yaml_keys(RunConfig)} | {f"grpo:{k}" for k in yaml_keys(GRPORunConfig)}
    for where, names in _file_keys().items():
        if where not in ("es", "grpo"):  # the run configs: yaml_keys above (the same walk)
            keys |= {f"{where}:{k}" for k in names}
    keys |= {f"ESConfig:{f.name}" for f in dataclasses.fields(ESConfig)}
    task = [k for k in datafile.KEYS if k not in ("prompt", "dataset")]
    task += [f"prompt.{k}" for k in datafile.PROMPT_KEYS] + [f"dataset.{k}" for k in datafile.DATASET_KEYS]
    keys |= {f"taskfile:{k}" for k in task}
    for where, obj in _api_entry_points().items():
        keys |= {f"{where}:{p}" for p in inspect.signature(obj).parameters if p not in ("self", "cls")}
    return keys


def _es(*keys: str) -> tuple[str, ...]:
    return tuple(f"es:{k}" for k in keys)


def _grpo(*keys: str) -> tuple[str, ...]:
    return tuple(f"grpo:{k}" for k in keys)


def _where(where: str, *keys: str) -> tuple[str, ...]:
    return tuple(f"{where}:{k}" for k in keys)


WANDB = ("logging.wandb.project", "logging.wandb.entity", "logging.wandb.mode", "logging.wandb.group",
         "logging.wandb.name", "logging.wandb.table_every", "logging.wandb.table_rows")
TRL_ARGS = ("grpo.mini_batch_size", "grpo.micro_batch_size", "grpo.weight_decay", "grpo.adam_beta1",
            "grpo.adam_beta2", "grpo.adam_epsilon", "grpo.max_grad_norm", "grpo.warmup_updates", "grpo.lr_scheduler",
            "grpo.gradient_checkpointing", "grpo.vllm_gpu_memory_utilization")
EXPERIMENT_EVAL = tuple(f"eval.{k}" for k in ("samples", "ks", "temperature", "top_p", "max_new_tokens", "greedy",
                                              "limit", "batch_size", "seed", "ci_resamples", "backend", "engines",
                                              "engines_per_gpu"))

#: test (file::function) -> the keys it exercises.
EXERCISED: dict[str, tuple[str, ...]] = {
    # ---------------------------------------------------------------- the ES run config (tests/test_keys_es.py)
    "test_keys_es.py::test_model": _es("model"),
    "test_keys_es.py::test_task_names_the_registered_task_trained": _es("task"),
    "test_keys_es.py::test_data_path_replaces_the_tasks_data": _es("data_path"),
    "test_keys_es.py::test_tasks_dir_registers_its_task_files": _es("tasks_dir"),
    "test_keys_es.py::test_data_dir_holds_the_evaluated_tasks_data": _es("data_dir"),
    "test_keys_es.py::test_dtype": _es("dtype"),
    "test_keys_es.py::test_device_reaches_the_model_loader": _es("device"),
    "test_keys_es.py::test_population_size": _es("es.population_size"),
    "test_keys_es.py::test_sigma_scales_the_perturbations": _es("es.sigma"),
    "test_keys_es.py::test_alpha_scales_the_update": _es("es.alpha"),
    "test_es_train.py::test_alpha_zero_leaves_weights_bit_identical": _es("es.alpha"),
    "test_keys_es.py::test_shaping_none_weights_by_the_raw_rewards": _es("es.shaping"),
    "test_keys_es.py::test_shaping_rank_weights_by_centred_ranks": _es("es.shaping"),
    "test_keys_es.py::test_zscore_eps_enters_the_denominator": _es("es.zscore_eps"),
    "test_keys_es.py::test_estimator_two_point_evaluates_antithetic_pairs": _es("es.estimator"),
    "test_keys_es.py::test_format_reward_pays_a_formatted_wrong_answer": _es("es.format_reward"),
    "test_keys_es.py::test_restore_subtract_drifts_where_exact_does_not": _es("es.restore"),
    "test_keys_es.py::test_master_weights": _es("es.master_weights"),
    "test_keys_es.py::test_sampling_seeds_independent_gives_each_member_its_own_stream": _es("es.sampling_seeds"),
    "test_keys_es.py::test_direction_cache_mb_zero_draws_the_directions_again": _es("es.direction_cache_mb"),
    "test_keys_es.py::test_reward_control_shuffle_detaches_rewards_from_directions": _es("es.reward_control"),
    "test_keys_es.py::test_perturbation_lowrank_and_rank": _es("es.perturbation", "es.rank"),
    "test_keys_es.py::test_anchor_decay_pulls_the_update_towards_the_start": _es("es.anchor_decay"),
    "test_keys_es.py::test_batch_size": _es("train.batch_size"),
    "test_keys_es.py::test_epochs_when_max_steps_is_none": _es("train.epochs"),
    "test_keys_es.py::test_max_steps": _es("train.max_steps"),
    "test_keys_es.py::test_seed_draws_other_directions": _es("train.seed"),
    "test_keys_es.py::test_split_trains_on_another_split": _es("train.split"),
    "test_keys_es.py::test_limit": _es("train.limit"),
    "test_keys_es.py::test_stream_start_reads_the_stream_from_that_position": _es("train.stream_start"),
    "test_keys_es.py::test_temperature": _es("generation.temperature"),
    "test_keys_es.py::test_top_p_keeps_only_the_nucleus": _es("generation.top_p"),
    "test_keys_es.py::test_max_new_tokens": _es("generation.max_new_tokens"),
    "test_keys_es.py::test_generation_batch_size_bounds_the_forward_rows": _es("generation.batch_size"),
    "test_keys_es.py::test_checkpoint_every": _es("checkpoint.every"),
    "test_keys_es.py::test_keep_last": _es("checkpoint.keep_last"),
    "test_keys_es.py::test_eval_every": _es("eval.every"),
    "test_keys_es.py::test_eval_tasks": _es("eval.tasks"),
    "test_keys_es.py::test_eval_samples": _es("eval.samples"),
    "test_keys_es.py::test_eval_temperature": _es("eval.temperature"),
    "test_keys_es.py::test_eval_max_new_tokens": _es("eval.max_new_tokens"),
    "test_keys_es.py::test_eval_ks": _es("eval.ks"),
    "test_keys_es.py::test_eval_limit": _es("eval.limit"),
    "test_keys_es.py::test_eval_greedy": _es("eval.greedy"),
    "test_keys_es.py::test_eval_split": _es("eval.split"),
    "test_keys_es.py::test_backend_batched_and_population_batch": _es("backend.type", "backend.population_batch"),
    "test_keys_es.py::test_backend_vllm_builds_the_vllm_evaluator": _es("backend.type", "backend.check_every"),
    # a Ray pool built from the config: 2 engines, a checksum after every update (check_every 1)
    "test_ray_pool.py::test_ray_run_is_bit_identical_to_single_process": _es("backend.type", "backend.engines",
                                                                             "backend.check_every"),
    "test_ray_pool.py::test_unreachable_address_through_the_config": _es("backend.ray_address"),
    "test_ray_sharded.py::test_sharded_pool_trains_with_engines_identical_to_the_trainer": _es("backend.update"),
    # vLLM engines (GPU): the options and Ray resources built from the config
    "test_tp_config.py::test_engines_get_tensor_parallel_options_and_one_bundle_of_tp_gpus": _es(
        "backend.tensor_parallel_size", "backend.engines_per_gpu", "backend.engine"),
    "test_engines_per_gpu.py::test_vllm_options_split_the_memory_reservation": _es("backend.engines_per_gpu"),
    "test_vllm_lora.py::test_engine_options_enable_lora_only_for_the_batched_path": _es("backend.members"),
    "test_keys_es.py::test_coverage_keys": _es("coverage.every", "coverage.prompts", "coverage.samples",
                                               "coverage.temperature"),
    "test_keys_es.py::test_wandb_keys_reach_wandb": _es(*WANDB),
    "test_wandb_logging.py::test_es_run_logs_update_metrics_heldout_entropy_and_a_completions_table": _es(
        "logging.wandb.project", "logging.wandb.table_every", "logging.wandb.table_rows"),
    "test_trl_habits.py::test_logging_steps_thin_tensorboard_not_metrics_jsonl": _es("logging.logging_steps"),
    "test_trl_habits.py::test_state_model_and_log_history_after_train": _es("logging.logging_steps"),
    "test_trl_habits.py::test_report_to_wandb_only_writes_no_tensorboard_and_builtin_verifiers_log_task_reward": _es(
        "logging.report_to"),
    # ---------------------------------------------------------------- the GRPO run config (tests/test_keys_grpo.py)
    "test_keys_grpo.py::test_model": _grpo("model"),
    "test_keys_grpo.py::test_task": _grpo("task"),
    "test_keys_grpo.py::test_tasks_dir": _grpo("tasks_dir"),
    "test_keys_grpo.py::test_split": _grpo("train.split"),
    "test_keys_grpo.py::test_data_path": _grpo("data_path"),
    "test_keys_grpo.py::test_dtype_reaches_the_model_loader": _grpo("dtype"),
    "test_keys_grpo.py::test_device_reaches_trl": _grpo("device"),
    "test_keys_grpo.py::test_batch_size": _grpo("train.batch_size"),
    "test_keys_grpo.py::test_max_steps": _grpo("train.max_steps"),
    "test_keys_grpo.py::test_seed": _grpo("train.seed"),
    "test_keys_grpo.py::test_limit": _grpo("train.limit"),
    "test_keys_grpo.py::test_stream_start": _grpo("train.stream_start"),
    "test_keys_grpo.py::test_epochs": _grpo("train.epochs"),
    "test_keys_grpo.py::test_generation_temperature_top_p_and_max_new_tokens": _grpo(
        "generation.temperature", "generation.top_p", "generation.max_new_tokens"),
    "test_keys_grpo.py::test_generation_batch_size": _grpo("generation.batch_size"),
    "test_keys_grpo.py::test_checkpoint_every": _grpo("checkpoint.every"),
    "test_keys_grpo.py::test_keep_last": _grpo("checkpoint.keep_last"),
    "test_keys_grpo.py::test_keep_trainer_states": _grpo("checkpoint.keep_trainer_states"),
    "test_grpo_run.py::test_checkpoints_are_saved_in_the_base_dtype_by_default": _grpo("checkpoint.save_dtype"),
    "test_keys_grpo.py::test_eval_every": _grpo("eval.every"),
    "test_keys_grpo.py::test_eval_tasks_split_limit_and_data_dir": _grpo("eval.tasks", "eval.split", "eval.limit",
                                                                         "data_dir"),
    "test_keys_grpo.py::test_eval_samples_temperature_and_max_new_tokens": _grpo(
        "eval.samples", "eval.temperature", "eval.max_new_tokens"),
    "test_keys_grpo.py::test_eval_ks_and_greedy": _grpo("eval.ks", "eval.greedy"),
    "test_keys_grpo.py::test_wandb_keys": _grpo(*WANDB),
    "test_wandb_logging.py::test_grpo_run_forwards_report_to_trl_and_logs_our_rows_and_a_completions_table": _grpo(
        "logging.wandb.project", "logging.wandb.table_rows"),
    "test_keys_grpo.py::test_num_generations": _grpo("grpo.num_generations"),
    "test_grpo_run.py::test_zero_learning_rate_leaves_weights_bit_identical": _grpo("grpo.learning_rate"),
    # TRL's loss and gradients against our reference loss, per variant (every loss type, gspo with KL)
    "test_grpo_variants.py::test_trl_loss_and_gradients_match_the_reference_per_variant": _grpo(
        "grpo.loss_type", "grpo.importance_sampling_level", "grpo.epsilon", "grpo.epsilon_high", "grpo.beta",
        "grpo.kl_ratio_correction", "grpo.mask_truncated_completions"),
    "test_grpo_variants.py::test_dr_grpo_trains_on_unscaled_advantages_and_logs_its_rollouts": _grpo(
        "grpo.standardize_advantages"),
    # a preset's mini-batches: several optimizer steps per update, ratios off 1 from the second on
    "test_grpo_presets.py::test_each_preset_engages_its_mechanism_and_differs_from_grpo": _grpo("grpo.mini_batches"),
    "test_grpo_variants.py::test_reference_dtype_reaches_trls_reference_model": _grpo("grpo.reference_dtype"),
    "test_grpo_variants.py::test_soft_overlong_punishment_is_trls_with_the_share_of_the_limit": _grpo(
        "grpo.soft_overlong_punishment"),
    "test_keys_grpo.py::test_format_reward_reaches_the_verifier": _grpo("grpo.format_reward"),
    "test_keys_grpo.py::test_reaches_trls_grpo_config": _grpo(*TRL_ARGS),
    "test_keys_grpo.py::test_bf16_reaches_trl": _grpo("grpo.bf16"),
    "test_grpo_rollouts.py::test_a_run_trains_on_either_engine_and_records_which": _grpo("grpo.rollouts"),
    "test_experiment_launch.py::test_vllm_rollout_fields_are_trl_116_grpoconfig_fields": _grpo(
        "grpo.use_vllm", "grpo.vllm_mode", "grpo.vllm_sleep", "grpo.vllm_server_url"),
    # ---------------------------------------------------------------- sequence, experiment, sweep
    "test_experiments.py::test_sequence_defaults_to_the_stage_configs_common_budget_and_applies_overrides": _where(
        "sequence", "stages", "total_updates", "es", "grpo"),
    "test_experiments.py::test_stage2_continues_stage1_data_stream_as_one_run_of_t_updates": _where(
        "sequence", "stages", "es", "grpo"),
    "test_keys_files.py::test_sequence_model_starts_the_first_stage": _where("sequence", "model"),
    "test_keys_files.py::test_experiment_name": _where("experiment", "name"),
    "test_keys_files.py::test_experiment_methods_and_checkpoints": _where("experiment", "methods", "checkpoints"),
    "test_experiments.py::test_experiment_trains_what_is_missing_and_evaluates_everything": _where(
        "experiment", "methods", "checkpoints"),
    "test_keys_files.py::test_experiment_model_is_the_base_evaluated": _where("experiment", "model"),
    "test_keys_files.py::test_experiment_tasks_dir_registers_the_files_beside_it": _where("experiment", "tasks_dir"),
    "test_keys_files.py::test_experiment_data_dir": _where("experiment", "data_dir"),
    "test_keys_files.py::test_experiment_eval_keys_reach_the_evaluation": _where("experiment", *EXPERIMENT_EVAL),
    "test_keys_files.py::test_experiment_eval_in_domain_and_held_out": _where("experiment", "eval.in_domain",
                                                                               "eval.held_out"),
    "test_keys_files.py::test_experiment_eval_tensor_parallel_size": _where("experiment", "eval.tensor_parallel_size"),
    "test_keys_files.py::test_experiment_report_pairs": _where("experiment", "report.pairs"),
    "test_keys_files.py::test_experiment_configs_model_task_and_updates_reach_the_stage_configs": _where(
        "experiment", "configs.es", "configs.grpo", "model", "task", "updates"),
    "test_seeds.py::test_seeds_set_train_seed_of_every_stage_config": _where("experiment", "seeds"),
    "test_budget.py::test_a_variants_entry_defines_a_method_from_a_preset_with_an_overlay_and_family": _where(
        "experiment", "variants"),
    "test_budget.py::test_match_rollouts_gives_every_grpo_method_the_updates_that_sample_as_many_responses_as_es":
        _where("experiment", "match"),
    "test_offtask_run.py::test_experiment_measures_offtask_kl_of_every_method_and_reuses_it": _where(
        "experiment", "analysis"),
    "test_plan_terms.py::test_decode_step_reads_the_kv_cache_and_the_cap_share_lengthens_the_tail": _where(
        "experiment", "plan.runaway_share"),
    "test_keys_files.py::test_sweep_section_keys": _where(
        "sweep", "sweep.param", "sweep.values", "sweep.reference", "sweep.checkpoints", "sweep.heldout_suite",
        "sweep.tolerance", "sweep.band_window", "sweep.seeds"),
    # ---------------------------------------------------------------- task files
    "test_task_files.py::test_template_prompt_builtin_verifier_and_text_gold": _where(
        "taskfile", "task", "data", "prompt.template", "prompt.system", "gold", "verifier"),
    "test_task_files.py::test_reward_task_from_a_py_file_with_vote_function": _where(
        "taskfile", "reward", "vote", "prompt.chat"),
    "test_task_files.py::test_regex_vote_and_field_and_messages_prompts": _where(
        "taskfile", "vote", "prompt.field", "prompt.messages"),
    "test_task_files.py::test_a_user_task_named_like_a_builtin_is_refused_unless_override": _where(
        "taskfile", "override"),
    "test_keys_files.py::test_task_file_description_and_id": _where("taskfile", "description", "id"),
    "test_keys_files.py::test_task_file_reward_weights_and_pass_threshold": _where(
        "taskfile", "reward_weights", "pass_threshold"),
    "test_keys_files.py::test_task_file_scorer": _where("taskfile", "scorer"),
    "test_keys_files.py::test_task_file_dataset_from_the_hub": _where(
        "taskfile", "dataset.path", "dataset.name", "dataset.splits"),
    # ---------------------------------------------------------------- the Python API (tests/test_keys_api.py)
    "test_keys_api.py::test_output_dir": _where("ESConfig", "output_dir"),
    "test_keys_api.py::test_reward_weights_and_pass_threshold": _where("ESConfig", "reward_weights", "pass_threshold"),
    # without reward_funcs they have nothing to act on: refused (the other face of their effect)
    "test_keys_api.py::test_reward_weights_and_pass_threshold_without_reward_funcs_are_refused": (
        "ESConfig:reward_weights", "ESConfig:pass_threshold", "GRPOComparator:reward_weights",
        "GRPOComparator:pass_threshold", "evaluate:reward_weights", "evaluate:pass_threshold"),
    "test_keys_api.py::test_model_wins_over_args_model": _where("ESTrainer", "model"),
    "test_api.py::test_an_in_memory_model_trains_like_its_directory": _where("ESTrainer", "model"),
    "test_keys_api.py::test_reward_funcs_score_the_members": _where("ESTrainer", "reward_funcs"),
    "test_keys_api.py::test_train_and_eval_dataset": _where("ESTrainer", "train_dataset", "eval_dataset"),
    "test_keys_api.py::test_args": _where("ESTrainer", "args"),
    "test_keys_api.py::test_processing_class_renders_the_prompts": _where("ESTrainer", "processing_class"),
    "test_keys_api.py::test_answer_fn_gives_maj_at_k": _where("ESTrainer", "answer_fn"),
    "test_api.py::test_resume_and_save_model_through_the_api": (
        "ESTrainer.train:resume_from_checkpoint", "ESTrainer.save_model:output_dir"),
    "test_trl_habits.py::test_callbacks_get_transformers_events_and_should_training_stop_ends_the_run": _where(
        "ESTrainer", "callbacks"),
    "test_user_surface.py::test_resume_refuses_other_data_and_other_rewards_unless_accepted": (
        "ESTrainer.train:accept_task_change",),
    "test_user_surface.py::test_grpo_resume_refuses_other_data_unless_accepted": ("GRPOComparator.train:accept_task_change",),
    "test_keys_grpo.py::test_comparator_model_wins_over_the_config": _where("GRPOComparator", "model"),
    "test_keys_grpo.py::test_comparator_reward_funcs_and_train_dataset": _where("GRPOComparator", "reward_funcs",
                                                                                "train_dataset"),
    "test_keys_grpo.py::test_comparator_args": _where("GRPOComparator", "args"),
    "test_keys_grpo.py::test_comparator_output_dir_and_overrides": _where("GRPOComparator", "output_dir", "overrides"),
    "test_keys_grpo.py::test_comparator_reward_weights_and_pass_threshold": _where(
        "GRPOComparator", "reward_weights", "pass_threshold"),
    "test_keys_grpo.py::test_comparator_task": _where("GRPOComparator", "task"),
    "test_keys_grpo.py::test_comparator_train_resume_from_checkpoint": ("GRPOComparator.train:resume_from_checkpoint",),
    "test_keys_api.py::test_evaluate_model": _where("evaluate", "model"),
    "test_keys_api.py::test_evaluate_dataset_and_reward_funcs": _where("evaluate", "dataset", "reward_funcs"),
    "test_keys_api.py::test_evaluate_task_split_limit_and_data_dir": _where(
        "evaluate", "task", "split", "limit", "data_dir"),
    "test_keys_api.py::test_evaluate_tasks_dir": _where("evaluate", "tasks_dir"),
    "test_keys_api.py::test_evaluate_n_and_k": _where("evaluate", "n", "k"),
    "test_keys_api.py::test_evaluate_pass_threshold": _where("evaluate", "pass_threshold"),
    "test_keys_api.py::test_evaluate_answer_fn": _where("evaluate", "answer_fn"),
    "test_keys_api.py::test_evaluate_reward_weights": _where("evaluate", "reward_weights"),
    "test_keys_api.py::test_evaluate_name_registers_and_seeds": _where("evaluate", "name"),
    "test_keys_api.py::test_evaluate_temperature_top_p_seed_and_max_new_tokens": _where(
        "evaluate", "temperature", "top_p", "seed", "max_new_tokens"),
    "test_keys_api.py::test_evaluate_greedy": _where("evaluate", "greedy"),
    "test_keys_api.py::test_evaluate_output_dir": _where("evaluate", "output_dir"),
    "test_keys_api.py::test_evaluate_batch_size": _where("evaluate", "batch_size"),
    "test_keys_api.py::test_evaluate_dtype": _where("evaluate", "dtype"),
    "test_keys_api.py::test_evaluate_device_reaches_the_loader": _where("evaluate", "device"),
    "test_keys_api.py::test_evaluate_ci_resamples": _where("evaluate", "ci_resamples"),
    "test_keys_api.py::test_evaluate_processing_class": _where("evaluate", "processing_class"),
    "test_keys_api.py::test_evaluate_progress": _where("evaluate", "progress"),
}


def exercised() -> dict[str, list[str]]:
    """key -> the tests that exercise it: :data:`EXERCISED` inverted, plus each flat ``ESConfig`` field
    that stands for a YAML key, exercised by :data:`FLAT_FIELD_TEST` and by the YAML key's tests."""
    from esreason.api.config import FIELD_KEYS

    out: dict[str, list[str]] = {}
    for test, keys in EXERCISED.items():
        for key in keys:
            out.setdefault(key, []).append(test)
    for flat, key in FIELD_KEYS.items():
        if f"es:{key}" in out:
            out.setdefault(f"ESConfig:{flat}", []).extend([FLAT_FIELD_TEST, *out[f"es:{key}"]])
    return out


__all__ = ["EXERCISED", "FLAT_FIELD_TEST", "documented_keys", "exercised"]
