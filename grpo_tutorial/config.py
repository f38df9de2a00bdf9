"""Every hyperparameter of a GRPO run, in one dataclass, checked when it is built.

A field's doc says what it does; :class:`GRPOConfig` refuses a bad value at once,
with the field, the value and what it should be, before any model is touched.
Chapter 11 maps these names to TRL's ``GRPOConfig``.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
from dataclasses import dataclass
from typing import Any, Sequence

from ._checks import (
    check_choice, check_flag, check_int, check_number, check_time_limit, config_error, is_number, type_error,
)
from .advantages import BASELINES, MULTI_OBJECTIVE_AGGREGATIONS, SCALES, STDS
from .loss import LossOptions

__all__ = ["ALL_LINEAR", "GRPOConfig", "IS_MODES", "REPORT_TO", "SAMPLERS", "field_docs"]

_OWNER = "GRPOConfig"
_LOSS = LossOptions()  # the loss fields' defaults are LossOptions' (defined there, once)
#: PEFT's name for every linear layer but the output layer (``lora_target_modules``' default).
ALL_LINEAR = "all-linear"
#: What ``report_to`` takes (TRL's and transformers' name): no reporting, or TensorBoard's event files.
REPORT_TO = ("none", "tensorboard")
#: TRL's ``vllm_importance_sampling_mode`` values: (token or sequence) x (truncate or mask); the correction is
#: :mod:`grpo_tutorial.mismatch`'s. Defined here, so that the settings load without the samplers.
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
#: What ``GRPOConfig.sampler`` takes: the policy itself, or a copy of it that differs from the learner.
SAMPLERS = ("policy", "bfloat16", "stale", "top_p", "float16")


@dataclass
class GRPOConfig:
    """Every hyperparameter of a GRPO run, with CPU-sized defaults.

    The defaults are the settings first calibrated for the tiny model on a
    2-core CPU (B = 16 prompts, G = 8, 4 new tokens, temperature 1, lr 1e-4,
    clip 0.2, gradient clip 1.0), except mu = 1 where that calibration used 2.
    The tuned tiny run (chapter 8's recipe) and the runs of a real LLM are named
    presets (:func:`grpo_tutorial.presets.get_preset`). For a real LLM on a GPU,
    typical values are ``group_size=8..16``, ``max_new_tokens=256..1024``,
    ``learning_rate=1e-6..1e-5``.

    Batches and updates. A step samples a *generation batch* of B*G completions.
    ``minibatch_size`` sets the size of one optimizer update (None: the whole
    batch, so with mu = 1 a step makes exactly one update, on-policy).
    ``micro_batch_size`` only sets how many completions go through the model at
    once (memory); the gradients of a minibatch's micro-batches are accumulated
    into one update, with each loss type's normaliser kept as TRL keeps it.

    The loss's settings (``loss_type``, ``beta``, ``kl_kind``, ``clip_eps``,
    ``clip_eps_high``, ``importance_sampling_level``, ``delta``, the SAPO
    temperatures, ``mask_truncated_completions``, ``top_entropy_quantile``,
    ``entropy_coef``, ``off_policy_mask_threshold``, ``use_bias_correction_kl``
    and VESPO's shape) are fields here under TRL's names, but are defined,
    documented and checked in one place, :class:`~grpo_tutorial.loss.LossOptions`
    (:func:`field_docs` reads their docs from there); :meth:`loss_options` builds
    one from them.

    Attributes:
        group_size: G, completions per prompt (>= 2: a group needs a baseline).
        prompts_per_step: B, prompts per step; a step samples B*G completions.
        max_new_tokens: completion budget; longer completions are truncated.
        temperature: sampling temperature; log-probs are scored at the same T.
        top_p: must be 1.0 for training, unless ``sampler="top_p"``. Nucleus
            sampling draws from a truncated distribution, but the scorer
            computes log-probs under the full softmax(logits / T), so the
            first-pass ratio would not be 1 and the objective would be biased;
            the trainer refuses it rather than train on a wrong ratio. With
            ``sampler="top_p"`` (a sampler that is declared not to be the
            learner) it is that sampler's nucleus, in (0, 1).
        learning_rate, weight_decay: AdamW settings.
        warmup_steps: linear learning-rate warmup, counted in optimizer updates.
        num_iterations: mu, passes over each generation batch.
        minibatch_size: completions per optimizer update (None = all B*G). It
            must divide B*G; a step makes mu * B*G / minibatch_size updates.
        micro_batch_size: completions per forward/backward pass (None = the
            whole minibatch). It must divide the minibatch size. Memory only:
            it does not change the number of updates.
        disable_dropout: set every dropout probability of the policy (and the
            reference) to 0 when the trainer is built, as TRL's
            ``disable_dropout`` does. Default True: with dropout on, the gradient
            pass would score other log-probs than the old-policy pass, so the
            first-pass ratio would not be 1 and the clip statistics would mean
            nothing. Models without dropout are unaffected.
        share_prompt_cache: in the scoring and loss passes, run each distinct
            prompt through the model once and let its G completions read its
            KV cache, instead of encoding it again on every row (generation
            always does this; it samples the same tokens either way). The same
            math, about half the forward and backward work when prompts are as
            long as completions; log-probs differ from the full pass only by
            float rounding (~1e-6 on the tiny model, ~2e-5 on SmolLM2). False
            scores every row in full, as TRL does. It falls back to the full
            pass by itself under gradient checkpointing or active dropout.
        onednn_generation: during ``generate``, multiply the linear layers
            with oneDNN instead of the default CPU BLAS
            (:mod:`grpo_tutorial.speedups`): on the book's CPU batched decoding of
            SmolLM2 ran about 1.6 times faster. None (default) = on for a
            float32 model on the CPU when PyTorch has the operators, off
            otherwise (GPUs are untouched); True = on, or an error; False = off.
            Only sampling and evaluation use it; the log-probs of the loss come
            from the model's own layers.
        merge_adapters_for_sampling: with ``use_peft``, sample (stage 1) and
            evaluate from a plain copy of the policy whose weights are the
            adapters merged into the base, ``W + (lora_alpha / lora_r) B A``,
            re-merged after every optimizer update
            (:mod:`grpo_tutorial.sampling.fast`): one matrix product per layer
            instead of three, the same distribution up to float rounding, the
            step still on-policy. The trained model is never merged in place
            (an unmerge would move its frozen base by rounding). Costs one more
            copy of the weights. None (default): on where the policy is on a CUDA
            GPU, off on the CPU (no CPU number moves); True: also on the CPU
            (needs ``use_peft``), where it made LoRA's sampling 1.3 to 1.6 times
            faster on the book's machine (``python -m benchmarks.sampler_cpu``),
            with other samples by float rounding; False: never.
        static_cache: generate with a static KV cache, so that every decoding
            step has the same shapes and transformers compiles it on a CUDA GPU
            (``torch.compile`` with CUDA graphs: one graph replayed instead of
            hundreds of kernel launches); prompts are left-padded to a width that
            is a multiple of 64 and never shrinks, so the compiled step is reused
            from step to step. The first call at a new shape pays the compile
            (the history's ``sampler/compile_seconds``). Used by the policy's
            sampler, the ``"float16"`` copy and the evaluations. None (default):
            on where the policy is on a CUDA GPU, off on the CPU (no CPU number
            moves); True: also on the CPU, where nothing is compiled and a
            decoding step was slower on the book's machine; False: never (TRL's
            ``generate`` path compiles nothing either).
        sampler: what writes the completions (:mod:`grpo_tutorial.sampling`).
            ``"policy"`` (default): the policy itself, so sampler and learner
            are one model and the step is exactly on-policy. The others are a
            sampler that is not the learner, as when a real run generates in
            another engine: ``"bfloat16"``, a copy of the policy cast to
            bfloat16; ``"stale"``, a copy ``sampler_staleness`` optimizer
            updates behind the policy (asynchronous RL); ``"top_p"``, the
            policy sampling from the nucleus of ``top_p``, which the scorer's
            softmax does not apply; ``"float16"``, a copy of the policy (its
            adapters merged) in float16, sampled with the static cache where
            ``static_cache`` says: the fast sampler of a GPU without bfloat16
            (a T4), the learner kept in float32. Its every rollout is checked
            for non-finite logits and log-probs (Qwen2 can overflow float16)
            and made again by the float32 policy when they are not (the
            history's ``sampler/fallbacks``). Each keeps its own log-probs of what it
            sampled with the rollout, the history gets the ``mismatch/...``
            diagnostics, and the copy is synced after every optimizer update
            (a resumed run restarts the copy from the policy it loads). Stage 4
            then always scores the rollout with the policy (the on-policy
            shortcut is off), as TRL does with vLLM: the diagnostics and the
            correction compare the sampler's log-probs with those.
        sampler_staleness: k, the optimizer updates by which the ``"stale"``
            sampler lags the policy (>= 1; it keeps k snapshots of the
            weights). Only with ``sampler="stale"``.
        max_tool_calling_iterations: with tools (``GRPOTrainer(tools=[...])``,
            :mod:`grpo_tutorial.tools`), the rounds of tool calls a completion may
            make; at the limit the completion ends with its last call unanswered.
            TRL's name and meaning; None (TRL's default): no limit.
        tool_time_limit: seconds one tool call may take before it is answered
            with an error result (a failure). Ours: TRL has no time limit. None: none.
            At most ``threading.TIMEOUT_MAX`` (what a thread can be waited for).
        tool_rollout_time_limit: seconds all the tool calls of one rollout may
            take together; the calls after it get an error result without running
            (failures). Ours. None: none.
        mask_tool_tokens: train on the policy's tokens only, ``completion_mask *
            tool_mask``, as TRL always does (True). False is chapter 16's control
            (the tool's tokens in the loss), not a setting for real runs. Ours.
        vllm_importance_sampling_correction: multiply each token's loss by
            the importance weight pi_old / mu of the sampler mu, truncated or
            masked as ``vllm_importance_sampling_mode`` says
            (:func:`~grpo_tutorial.mismatch.sampler_weights`), as TRL 1.16 does
            with vLLM. TRL's name; default False, where TRL's is True: here a
            sampler that is not the learner must be chosen on purpose
            (``sampler``), and TRL corrects only when generating with vLLM,
            whose log-probs differ from the scoring pass's at least by rounding;
            switched on by default it would change every golden run. It needs
            a sampler that returns its log-probs (``sampler`` other than
            ``"policy"``, or a ``sampler=`` function that fills
            ``Rollout.sampler_logprobs``). With ``loss_type="vespo"`` the weights
            join VESPO's sequence weight instead of multiplying the loss, as in TRL.
        vllm_importance_sampling_mode: ``"token_truncate"``, ``"token_mask"``,
            ``"sequence_truncate"`` or ``"sequence_mask"`` (TRL's default): a
            ratio per token or one per completion, clipped to or zeroed outside
            ``[clip_min, clip_max]``. TRL's name and default.
        vllm_importance_sampling_clip_min: C_min, the lower bound (None = none;
            TRL's name and default). Must be below C_max.
        vllm_importance_sampling_clip_max: C_max, the upper bound (None = none;
            TRL's name and default, 3.0). A truncate mode needs at least one bound.
        use_adaptive_entropy: Skywork-OR1's adaptive entropy control (TRL's
            name and rule). After each optimizer update the mean entropy of that
            update's tokens is compared with ``entropy_target``: at or below it,
            the coefficient rises by ``entropy_coef_delta``, above it, it falls
            by as much, within ``[entropy_coef_min, entropy_coef_max]``; the
            bonus is applied only while the last measured entropy is at or below
            the target (so not in the first update). The history's
            ``entropy_coef`` is the coefficient after the step; a checkpoint
            keeps the controller's state.
        entropy_target: the target mean per-token entropy, in nats (TRL's
            default 0.2 is near collapse for a language model: set it near the
            entropy you see early in training).
        entropy_coef_min, entropy_coef_max, entropy_coef_delta: the bounds and
            the step of the adaptive coefficient (TRL's defaults 0, 1, 0.005).
        advantage_baseline: what a reward is compared with. ``"group"`` (GRPO:
            the group mean), ``"rloo"`` (RLOO: the mean of the other G - 1
            rewards of the group) or ``"batch"`` (REINFORCE++: the mean of the
            whole batch; use it with ``scale_rewards="batch"`` or ``"none"``).
        dynamic_sampling: DAPO's dynamic sampling. Groups whose rewards are all
            equal carry no signal; keep drawing ``prompts_per_step`` more
            prompts, up to ``max_sampling_rounds`` rounds, until the step has
            ``prompts_per_step`` groups with non-zero reward std. If the cap is
            reached first, the step is filled up with zero-std groups (advantage
            0, as without the option). The history's ``groups_drawn`` counts the
            groups sampled; every round advances the data position.
        max_sampling_rounds: the cap of ``dynamic_sampling`` (>= 1).
        scale_rewards: ``"group"``, ``"batch"`` or ``"none"`` (Dr. GRPO).
        multi_objective_aggregation: with several reward functions,
            ``"sum_then_normalize"`` (default, GRPO: weight and sum the rewards,
            then compute advantages of the sum) or ``"normalize_then_sum"``
            (GDPO: z-score each function's rewards within the group, weight and
            sum those, then z-score the sum over the batch;
            :func:`~grpo_tutorial.advantages.normalize_then_sum`). The latter
            replaces ``scale_rewards`` and ``advantage_baseline``, which must
            then stay ``"group"`` (TRL ignores them silently).
        std: ``"sample"`` (Bessel) or ``"population"`` for the advantage std.
        max_grad_norm: gradient clipping threshold (None = no clipping, but the
            norm is still measured and logged).
        ref_sync_every: copy the policy into the reference every this many
            steps (None = never). Only used when beta > 0. With ``use_peft`` the
            copy is of the adapters only: the reference becomes the base with a
            frozen copy of the adapters as they are (TRL refuses
            ``sync_ref_model`` with PEFT; :mod:`grpo_tutorial.lora`).
        reward_weights: one weight per reward function (None = all 1).
        system_prompt: system message for chat-template models.
        use_chat_template: None = automatic (use it when the tokenizer has one).
        seed: seeds the data order, sampling and minibatch shuffles (see
            :mod:`grpo_tutorial.seeding`).
        log_every: log completions (``log_completions``) every this many
            steps (the progress bar shows every step's reward).
        log_completions: every ``log_every`` steps, print a few prompts,
            completions, their rewards and advantages (with the progress bar,
            which stays below them) and append them to
            ``output_dir/completions.jsonl`` (TRL's name;
            :mod:`grpo_tutorial.run.completions`).
        num_completions_to_print: how many completions to log each time,
            drawn at random (seeded by ``seed`` and the step) from the step's
            batch; None = all of them (TRL's default).
        completions_to_keep: completions kept from every step, printed or
            not (another seeded draw), in ``output_dir/completions.jsonl`` and
            the trainer's ``completions``, with what chapter 18's doctor reads:
            the reference answer, truncation, length, tool calls, and both
            readings of the answer (:mod:`grpo_tutorial.run.completions`; at
            most 8 KiB each). 0 keeps none.
        report_to: ``"tensorboard"``: every history row's numbers also go to
            TensorBoard, as scalars ``train/<key>`` at the row's step, in
            ``output_dir/tensorboard/``, flushed as each step ends, so
            ``%tensorboard --logdir OUT/tensorboard`` (Colab) shows the run live;
            a resumed run hides what the interrupted one wrote after its
            checkpoint (:mod:`grpo_tutorial.run.tensorboard`). Needs output_dir
            and the ``tensorboard`` package (the trainer refuses it, when it is
            built, without either). ``"none"`` (default): no reporting,
            which is also the default of transformers' ``TrainingArguments`` (and
            so of TRL's ``GRPOConfig``) in transformers 5.24, the version this
            was checked against. TRL's name; a list such as ``["tensorboard"]``
            is taken as transformers takes it, and stored as one name.
        checkpoint_every: save a checkpoint every this many steps and at the
            end of ``train`` (0 = no periodic checkpoints; Ctrl-C still saves
            one). Needs output_dir.
        checkpoint_in_place: overwrite the checkpoint's files at each save
            instead of writing a new checkpoint and deleting the old one. On
            Google Drive a deleted file goes to the bin and counts against the
            free 15 GB until the bin is emptied, so an atomic save of a 5.9 GB
            checkpoint leaves 5.9 GB behind each time; in place, only one
            checkpoint's bytes ever exist. The price: a save killed mid-way
            (about the time it takes to write the file) leaves no usable
            checkpoint (:mod:`grpo_tutorial.run.layout`). False (default):
            atomic saves, a complete checkpoint at every instant.
        use_peft: train LoRA adapters instead of every weight, through the
            ``peft`` package (``pip install peft``). TRL's ``ModelConfig`` name and
            default (False). The trainer wraps the policy with
            ``peft.get_peft_model`` (a model that already is a ``PeftModel`` is
            used as it is, with its own adapter settings: the ``lora_*`` fields
            then do not apply); only the adapters train and AdamW holds only
            them, the base weights stay bit-identical. The KL's reference is the
            base with the adapters switched off, no second copy of the model
            (a given ``PeftModel``'s reference is a frozen copy of its adapters,
            as in TRL). A checkpoint holds the adapters, not the base
            (:mod:`grpo_tutorial.lora`).
        lora_r: the adapters' rank r (TRL's default 16). Only with ``use_peft``.
        lora_alpha: the adapters' scale: the update ``B A x`` is multiplied by
            ``lora_alpha / lora_r`` (TRL's default 32). Holding it fixed while
            the rank changes, as "LoRA Without Regret" (Schulman et al., 2025)
            does, keeps the best learning rate about the same at every rank.
            Only with ``use_peft``.
        lora_dropout: dropout on the adapters' input (TRL's default 0.05).
            With ``disable_dropout`` (the default) it is set to 0 when the
            trainer is built, like every other dropout of the policy, so the
            first pass's ratio is exactly 1. Only with ``use_peft``.
        lora_target_modules: the layers that get adapters: ``"all-linear"``
            (default: every linear layer but the output layer, the attention
            projections and the MLP), a list of module names such as
            ``["q_proj", "v_proj"]``, a str other than ``"all-linear"`` (PEFT
            reads it as a regular expression of the whole module path), or None
            (PEFT's default for the model's type: the q and v projections for
            Qwen2). The default deliberately differs from TRL's None: "LoRA
            Without Regret" (Schulman et al., 2025) finds that adapters on the
            attention projections alone learn worse than adapters on every
            linear layer, MLP included, even at a matched number of parameters.
            Only with ``use_peft``.
        output_dir: where ``history.jsonl`` and ``checkpoint/`` go (None = keep
            the history in memory only).
        eval_batch_size: prompts per ``generate`` call in evaluation.
    """

    group_size: int = 8
    prompts_per_step: int = 16
    max_new_tokens: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    warmup_steps: int = 0
    beta: float = _LOSS.beta
    kl_kind: str = _LOSS.kl_kind
    clip_eps: float = _LOSS.clip_eps
    clip_eps_high: float | None = _LOSS.clip_eps_high
    num_iterations: int = 1
    minibatch_size: int | None = None
    micro_batch_size: int | None = None
    disable_dropout: bool = True
    share_prompt_cache: bool = True
    onednn_generation: bool | None = None
    merge_adapters_for_sampling: bool | None = None
    static_cache: bool | None = None
    sampler: str = "policy"
    sampler_staleness: int = 1
    max_tool_calling_iterations: int | None = None
    tool_time_limit: float | None = 10.0
    tool_rollout_time_limit: float | None = 60.0
    mask_tool_tokens: bool = True
    vllm_importance_sampling_correction: bool = False
    vllm_importance_sampling_mode: str = "sequence_mask"
    vllm_importance_sampling_clip_min: float | None = None
    vllm_importance_sampling_clip_max: float | None = 3.0
    loss_type: str = _LOSS.loss_type
    importance_sampling_level: str = _LOSS.importance_sampling_level
    delta: float | None = _LOSS.delta
    sapo_temperature_pos: float = _LOSS.sapo_temperature_pos
    sapo_temperature_neg: float = _LOSS.sapo_temperature_neg
    mask_truncated_completions: bool = _LOSS.mask_truncated_completions
    top_entropy_quantile: float = _LOSS.top_entropy_quantile
    entropy_coef: float = _LOSS.entropy_coef
    off_policy_mask_threshold: float | None = _LOSS.off_policy_mask_threshold
    use_bias_correction_kl: bool = _LOSS.use_bias_correction_kl
    vespo_k_pos: float = _LOSS.vespo_k_pos
    vespo_lambda_pos: float = _LOSS.vespo_lambda_pos
    vespo_k_neg: float = _LOSS.vespo_k_neg
    vespo_lambda_neg: float = _LOSS.vespo_lambda_neg
    use_adaptive_entropy: bool = False
    entropy_target: float = 0.2
    entropy_coef_min: float = 0.0
    entropy_coef_max: float = 1.0
    entropy_coef_delta: float = 0.005
    advantage_baseline: str = "group"
    dynamic_sampling: bool = False
    max_sampling_rounds: int = 4
    scale_rewards: str = "group"
    multi_objective_aggregation: str = "sum_then_normalize"
    std: str = "sample"
    max_grad_norm: float | None = 1.0
    ref_sync_every: int | None = None
    reward_weights: list[float] | None = None
    system_prompt: str | None = None
    use_chat_template: bool | None = None
    seed: int = 0
    log_every: int = 1
    log_completions: bool = False
    num_completions_to_print: int | None = None
    completions_to_keep: int = 8
    report_to: str = "none"
    checkpoint_every: int = 0
    checkpoint_in_place: bool = False
    output_dir: str | None = None
    eval_batch_size: int = 64
    use_peft: bool = False
    lora_r: int = 16
    lora_alpha: float = 32.0
    lora_dropout: float = 0.05
    lora_target_modules: str | list[str] | None = ALL_LINEAR

    def __post_init__(self) -> None:
        o = _OWNER
        check_int(o, "group_size", self.group_size, 2, hint="; a group needs at least 2 completions to have a baseline")
        for name in ("prompts_per_step", "max_new_tokens", "num_iterations", "log_every", "eval_batch_size"):
            check_int(o, name, getattr(self, name), 1)
        for name in ("warmup_steps", "checkpoint_every", "seed", "completions_to_keep"):
            check_int(o, name, getattr(self, name), 0)
        check_number(o, "temperature", self.temperature, lambda v: v > 0, "a number > 0")
        self._check_sampler()
        check_number(o, "learning_rate", self.learning_rate, lambda v: v > 0,
                     "a positive number (e.g. 1e-4 for the tiny model)")
        check_number(o, "weight_decay", self.weight_decay, lambda v: v >= 0, "a number >= 0")
        self.loss_options()  # every setting of the loss, validated where the loss defines them (loss.py)
        if self.loss_type != "cispo":  # a training run's clip range (the loss takes any > 0: chapter 4 unclips)
            check_number(o, "clip_eps_high", self.clip_eps_high, lambda v: 0 < v < 1,
                         "None or a number in (0, 1), e.g. 0.28 (only CISPO takes a cap above 2)", optional=True)
        self._check_sampling_options()
        check_choice(o, "scale_rewards", self.scale_rewards, SCALES)
        check_choice(o, "std", self.std, STDS)
        self._check_aggregation_and_entropy_control()
        check_flag(o, "log_completions", self.log_completions)
        check_flag(o, "checkpoint_in_place", self.checkpoint_in_place)
        check_int(o, "num_completions_to_print", self.num_completions_to_print, 1, optional=True,
                  hint=" (None = every completion of the logged step)")
        check_number(o, "max_grad_norm", self.max_grad_norm, lambda v: v > 0, "None or a number > 0", optional=True)
        check_int(o, "ref_sync_every", self.ref_sync_every, 1, optional=True)
        for flag in ("disable_dropout", "share_prompt_cache"):
            check_flag(o, flag, getattr(self, flag))
        check_flag(o, "onednn_generation", self.onednn_generation, optional=True)
        check_flag(o, "static_cache", self.static_cache, optional=True)
        n = self.batch_completions
        check_int(o, "minibatch_size", self.minibatch_size, 1, optional=True)
        if self.minibatch_size is not None and n % self.minibatch_size != 0:
            raise config_error(
                o, "minibatch_size", self.minibatch_size,
                f"a divisor of prompts_per_step*group_size = {self.prompts_per_step}*{self.group_size} = {n}",
            )
        check_int(o, "micro_batch_size", self.micro_batch_size, 1, optional=True)
        if self.micro_batch_size is not None and self.update_size % self.micro_batch_size != 0:
            raise config_error(
                o, "micro_batch_size", self.micro_batch_size,
                f"a divisor of the update size {self.update_size} (minibatch_size, or B*G when it is None)",
            )
        if self.reward_weights is not None:
            if isinstance(self.reward_weights, (str, bytes)) or not isinstance(self.reward_weights, Sequence):
                raise type_error(o, "reward_weights", self.reward_weights, "None or a list of numbers")
            if not all(is_number(w) for w in self.reward_weights):
                raise config_error(o, "reward_weights", self.reward_weights, "a list of finite numbers")
            self.reward_weights = [float(w) for w in self.reward_weights]
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise type_error(o, "system_prompt", self.system_prompt, "None or a str")
        check_flag(o, "use_chat_template", self.use_chat_template, optional=True, expected="None (auto), True or False")
        if self.output_dir is not None:
            if not isinstance(self.output_dir, (str, os.PathLike)):
                raise type_error(o, "output_dir", self.output_dir, "None or a path")
            self.output_dir = os.fspath(self.output_dir)
        self._check_report_to()
        self._check_lora()

    def _check_sampler(self) -> None:
        """``top_p``, the sampler and TRL's importance-sampling correction (:mod:`grpo_tutorial.mismatch`)."""
        o = _OWNER
        check_choice(o, "sampler", self.sampler, SAMPLERS)
        if self.sampler == "top_p":
            check_number(o, "top_p", self.top_p, lambda v: 0 < v < 1, "a number in (0, 1) with sampler='top_p'")
        elif is_number(self.top_p) and 0 < self.top_p < 1:
            raise config_error(
                o, "top_p", self.top_p, "1.0 for training",
                ": nucleus sampling draws from a truncated distribution but log-probs are scored under the "
                "full softmax(logits / T), so the ratio would be wrong from the first pass. Lower the "
                "temperature instead to sample more conservatively (or declare the sampler with "
                "sampler='top_p', whose own log-probs the correction can use)",
            )
        else:
            check_number(o, "top_p", self.top_p, lambda v: v == 1, "1.0 for training")
        check_int(o, "sampler_staleness", self.sampler_staleness, 1)
        check_flag(o, "vllm_importance_sampling_correction", self.vllm_importance_sampling_correction)
        check_choice(o, "vllm_importance_sampling_mode", self.vllm_importance_sampling_mode, IS_MODES)
        low, high = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        check_number(o, "vllm_importance_sampling_clip_min", low, lambda v: v >= 0, "None or a number >= 0",
                     optional=True)
        check_number(o, "vllm_importance_sampling_clip_max", high, lambda v: v > 0, "None or a number > 0",
                     optional=True)
        if low is not None and high is not None and low >= high:
            raise config_error(o, "vllm_importance_sampling_clip_min", low,
                               f"less than vllm_importance_sampling_clip_max = {high!r}")
        if self.vllm_importance_sampling_correction:
            if self.vllm_importance_sampling_mode.endswith("truncate") and low is None and high is None:
                raise config_error(o, "vllm_importance_sampling_clip_max", high,
                                   f"a number with vllm_importance_sampling_mode={self.vllm_importance_sampling_mode!r}",
                                   ": a truncate mode needs at least one bound (or set the clip_min)")

    def _check_sampling_options(self) -> None:
        o = _OWNER
        check_flag(o, "dynamic_sampling", self.dynamic_sampling)
        check_choice(o, "advantage_baseline", self.advantage_baseline, BASELINES)
        if self.advantage_baseline == "batch" and self.scale_rewards == "group":
            raise config_error(o, "scale_rewards", self.scale_rewards,
                               "'batch' or 'none' with advantage_baseline='batch'",
                               ": a group whose rewards are all equal has std 0, so dividing a batch-centred "
                               "reward by it would blow up (REINFORCE++ uses scale_rewards='batch')")
        check_int(o, "max_sampling_rounds", self.max_sampling_rounds, 1)
        check_int(o, "max_tool_calling_iterations", self.max_tool_calling_iterations, 0, optional=True,
                  hint=" (None = no limit, TRL's default)")
        check_time_limit(o, "tool_time_limit", self.tool_time_limit, expected="a number of seconds > 0")
        check_time_limit(o, "tool_rollout_time_limit", self.tool_rollout_time_limit, expected="a number of seconds > 0")
        check_flag(o, "mask_tool_tokens", self.mask_tool_tokens)

    def _check_report_to(self) -> None:
        """``report_to``: a name of :data:`REPORT_TO`, or a list of them as transformers takes (stored as one name)."""
        o, value = _OWNER, self.report_to
        expected = f"one of {list(REPORT_TO)} or a list of them"
        if isinstance(value, (list, tuple)) and all(isinstance(name, str) for name in value):
            names = set(value)
        elif isinstance(value, str):
            names = {value}
        else:
            raise type_error(o, "report_to", value, expected)
        if not names <= set(REPORT_TO):
            raise config_error(o, "report_to", value, expected,
                               ": the package writes TensorBoard's files only; to send each step's row elsewhere "
                               "(wandb, trackio, ...), append a function to GRPOTrainer.row_listeners")
        self.report_to = "tensorboard" if "tensorboard" in names else "none"  # [], ["none"]: none (as transformers)

    def _check_lora(self) -> None:
        """The LoRA fields; a list of target modules is stored as a list, ``["all-linear"]`` as that name."""
        o = _OWNER
        check_flag(o, "use_peft", self.use_peft)
        check_flag(o, "merge_adapters_for_sampling", self.merge_adapters_for_sampling, optional=True)
        if self.merge_adapters_for_sampling and not self.use_peft:
            raise config_error(o, "merge_adapters_for_sampling", True, "None or False with use_peft=False",
                               ": there are no adapters to merge (set use_peft=True to train LoRA adapters)")
        check_int(o, "lora_r", self.lora_r, 1)
        check_number(o, "lora_alpha", self.lora_alpha, lambda v: v > 0, "a number > 0 (TRL's default: 32)")
        check_number(o, "lora_dropout", self.lora_dropout, lambda v: 0 <= v < 1, "a number in [0, 1)")
        targets, expected = self.lora_target_modules, "None, 'all-linear', a regular expression or a list of module names"
        if isinstance(targets, (list, tuple)):
            if not targets or not all(isinstance(name, str) and name for name in targets):
                raise config_error(o, "lora_target_modules", targets, expected)
            if ALL_LINEAR in targets and len(targets) > 1:
                raise config_error(o, "lora_target_modules", targets, expected, f": {ALL_LINEAR!r} stands alone")
            self.lora_target_modules = ALL_LINEAR if list(targets) == [ALL_LINEAR] else list(targets)
        elif targets is not None and not (isinstance(targets, str) and targets):
            if isinstance(targets, str):
                raise config_error(o, "lora_target_modules", targets, expected)
            raise type_error(o, "lora_target_modules", targets, expected)

    def _check_aggregation_and_entropy_control(self) -> None:
        o = _OWNER
        check_choice(o, "multi_objective_aggregation", self.multi_objective_aggregation, MULTI_OBJECTIVE_AGGREGATIONS)
        if self.multi_objective_aggregation == "normalize_then_sum":
            for name in ("scale_rewards", "advantage_baseline"):
                if getattr(self, name) != "group":
                    raise config_error(
                        o, name, getattr(self, name), "'group' with multi_objective_aggregation='normalize_then_sum'",
                        ": GDPO z-scores each reward function in its group and the weighted sum over the batch; "
                        "it has no other baseline or scale",
                    )
        check_flag(o, "use_adaptive_entropy", self.use_adaptive_entropy)
        check_number(o, "entropy_target", self.entropy_target, lambda v: v >= 0, "a number >= 0 (nats per token)")
        check_number(o, "entropy_coef_delta", self.entropy_coef_delta, lambda v: v >= 0, "a number >= 0")
        check_number(o, "entropy_coef_min", self.entropy_coef_min, lambda v: v >= 0, "a number >= 0")
        check_number(o, "entropy_coef_max", self.entropy_coef_max, lambda v: v >= self.entropy_coef_min,
                     f"a number >= entropy_coef_min = {self.entropy_coef_min!r}")
        if self.use_adaptive_entropy and not self.entropy_coef_min <= self.entropy_coef <= self.entropy_coef_max:
            raise config_error(
                o, "entropy_coef", self.entropy_coef,
                f"in [entropy_coef_min, entropy_coef_max] = [{self.entropy_coef_min:g}, {self.entropy_coef_max:g}] "
                "with use_adaptive_entropy=True", ": it is the coefficient the controller starts from",
            )

    def loss_options(self) -> LossOptions:
        """The loss's settings (stage 5) as one validated, frozen :class:`~grpo_tutorial.loss.LossOptions`.

        The fields of the same names, plus ``max_completion_length=max_new_tokens``.
        It is what the trainer passes to :func:`~grpo_tutorial.loss.grpo_loss`;
        a bad setting raises ``ValueError`` (``TypeError`` for a value of the wrong
        type) naming ``GRPOConfig.<field>``.
        """
        values = {name: getattr(self, name) for name in LOSS_FIELDS}
        return LossOptions(**values, max_completion_length=self.max_new_tokens, owner=_OWNER)

    @property
    def batch_completions(self) -> int:
        """N = prompts_per_step * group_size, completions sampled per step."""
        return self.prompts_per_step * self.group_size

    @property
    def update_size(self) -> int:
        """Completions per optimizer update (``minibatch_size``, or all N)."""
        return self.minibatch_size or self.batch_completions

    @property
    def micro_size(self) -> int:
        """Completions per forward/backward pass."""
        return self.micro_batch_size or self.update_size

    @property
    def updates_per_step(self) -> int:
        """Optimizer updates per step: mu * N / minibatch_size."""
        return self.num_iterations * self.batch_completions // self.update_size

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: The config's fields that are :class:`~grpo_tutorial.loss.LossOptions` fields (all but ``max_completion_length``,
#: which is ``max_new_tokens``).
LOSS_FIELDS = tuple(f.name for f in dataclasses.fields(LossOptions) if f.name != "max_completion_length")

_ENTRY = re.compile(r"^([a-z_][a-z0-9_]*(?:, [a-z_][a-z0-9_]*)*): (.*)$")


def field_docs() -> dict[str, str]:
    """Each :class:`GRPOConfig` field's doc, from the ``Attributes:`` sections of the docstrings.

    The loss's fields are documented in :class:`~grpo_tutorial.loss.LossOptions`,
    the others in :class:`GRPOConfig`. One entry may document several fields
    (``learning_rate, weight_decay: AdamW settings.``); each of them gets its
    text. The text is joined into one line, markup and all. The command line's
    ``train --help`` is made from it, and a test checks that every field has one,
    so a new field cannot go undocumented.
    """
    own, loss = _attribute_docs(GRPOConfig), _attribute_docs(LossOptions)
    return {**own, **{name: loss[name] for name in LOSS_FIELDS if name in loss}}


def _attribute_docs(cls: type) -> dict[str, str]:
    """The entries of ``cls``'s docstring's ``Attributes:`` section, by field name."""
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    if "Attributes:" not in lines:
        raise RuntimeError(f"{cls.__name__}'s docstring has no 'Attributes:' section")
    docs: dict[str, list[str]] = {}
    current: list[str] = []
    for line in lines[lines.index("Attributes:") + 1:]:
        if line and not line.startswith(" "):
            break  # the section ends at the next unindented line
        text = line.strip()
        entry = _ENTRY.match(text) if line.startswith("    ") and not line.startswith("     ") else None
        if entry:
            current = [entry.group(2)]
            for name in entry.group(1).split(", "):
                docs[name] = current
        elif text:
            current.append(text)
    return {name: " ".join(parts) for name, parts in docs.items()}
