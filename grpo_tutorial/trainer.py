"""The GRPO trainer: the one stateful piece of the package.

:meth:`GRPOTrainer.train_step` is one GRPO step, one call per stage:

1. rollout: B prompts x G completions, one batched ``generate``  (rollout.py)
2. rewards: TRL-signature reward functions, weighted and summed    (rewards.py)
3. advantages: z-scores within each group                          (advantages.py)
4. old log-probs, from a no-grad pass (skipped when the step is exactly
   on-policy: then they are the gradient pass's own, detached)     (logprobs.py)
5. reference log-probs, only when beta > 0                         (logprobs.py)
6. mu passes over shuffled minibatches, one optimizer update each,
   accumulated over micro-batches: ``grpo_loss`` with the config's
   :class:`~grpo_tutorial.loss.LossOptions`                         (loss.py)
7. the history row and the failure-mode warnings                   (metrics.py)

With ``dynamic_sampling`` (DAPO), stages 1-2 run again on the next prompts of
the data stream until ``prompts_per_step`` groups have a learning signal (or
``max_sampling_rounds`` is reached); the step then trains on those groups
(:func:`~grpo_tutorial.rollout.keep_signal_groups`).

:meth:`GRPOTrainer.train` loops over a dataset with the run machinery of
:mod:`grpo_tutorial.run`: it appends to ``history.jsonl``, saves atomic
checkpoints and holds the output directory's lock, so a run killed at any moment
and resumed gives the same history as one never interrupted (on CPU, same seed).
Only wall-clock fields (:data:`TIMING_KEYS`) differ. Randomness comes from named
seed streams (seeding.py); building a trainer touches no global RNG.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ._checks import is_int
from .advantages import group_advantages, normalize_then_sum, zero_std_groups
from .config import GRPOConfig
from .evaluation import evaluate_policy
from .logprobs import rollout_logprobs, score_rollout
from .loss import grpo_loss
from .metrics import TIMING_KEYS, StageClock, check_failure_modes, step_row
from .models import disable_dropout
from .objectives import adapt_entropy_coef, applied_entropy_coef
from .optim import clip_and_step, make_optimizer, trainable_parameters
from .rewards import compute_rewards, extra_columns, judge_correct, reward_function_list, reward_function_means
from .rollout import Rollout, generate_rollouts, keep_signal_groups
from .run.checkpoint import (
    config_changes, load_model_state, read_checkpoint, restore_training_state, training_state, write_checkpoint,
)
from .run.completions import CompletionsWriter, sample_completions
from .run.disk import disk_errors
from .run.history import HistoryWriter, history_until, read_history, write_history
from .run.interrupt import StopAfterStep
from .run.layout import HISTORY_FILE, find_checkpoint, read_meta
from .run.lock import run_lock
from .run.progress import postfix, progress_bar
from .run.state import RunState, dataset_fingerprint
from .run.warn import GRPOWarning, caller_stacklevel
from .seeding import MINIBATCHES, RESAMPLING, SAMPLING, derive_seed, next_batch, stream_generator, stream_seed
from .tasks import as_rows, check_rows, validate_for_model

__all__ = [
    "GRPOConfig",
    "GRPOTrainer",
    "GRPOWarning",
    "TIMING_KEYS",
    "disable_dropout",
    "find_checkpoint",
    "load_model_state",
    "read_history",
]

#: The progress bar's fields: label -> (history key, format). A value the step did not compute is not shown.
PROGRESS_FIELDS = {"reward": ("reward_mean", ".3f"), "acc": ("accuracy", ".2f"), "kl": ("kl", ".4f")}


class GRPOTrainer:
    """GRPO for a Hugging Face causal LM, with verifiable reward functions.

    Args:
        model: the policy (a transformers causal LM), trained in place.
        tokenizer: its tokenizer (needs an EOS token).
        reward_fns: one reward function or a list, TRL signature
            ``fn(completions, *, answer, **kwargs) -> list[float | None]``.
        config: a :class:`GRPOConfig` (default: ``GRPOConfig()``).
        ref_model: the reference policy for the KL penalty. Only used when
            ``config.beta > 0``; if None, a frozen deep copy of ``model`` is made.
        accuracy_fn: what the ``accuracy`` metric counts as correct: a function
            with the reward signature returning 1.0 (correct) or 0.0 per
            completion. Default: the answer ``extract_answer`` finds equals the
            row's ``answer`` (``answers_match``). Pass ``countdown_reward`` for
            Countdown, whose answer is an expression, not a number.

    Attributes:
        step: completed training steps (``state.step``).
        state: where the run stands (:class:`~grpo_tutorial.run.state.RunState`):
            the step, the data position, the dataset's fingerprint, the skipped
            updates and the warnings given; its checkpoint form is part of every
            checkpoint.
        history: one dict per completed step (see :func:`~grpo_tutorial.metrics.step_row`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        reward_fns: Callable | Sequence[Callable],
        config: GRPOConfig | None = None,
        ref_model: torch.nn.Module | None = None,
        *,
        accuracy_fn: Callable | None = None,
    ) -> None:
        config = GRPOConfig() if config is None else config
        if not isinstance(config, GRPOConfig):
            raise TypeError(f"config must be a GRPOConfig, got {type(config).__name__}")
        fns = reward_function_list(reward_fns, config.reward_weights)
        if getattr(tokenizer, "eos_token_id", None) is None:
            raise ValueError("tokenizer.eos_token_id is None; the trainer needs an EOS token")
        if accuracy_fn is not None and not callable(accuracy_fn):
            raise TypeError(f"accuracy_fn must be None or a function, got {type(accuracy_fn).__name__}")
        if ref_model is not None and ref_model is model:
            raise ValueError(
                "ref_model is the policy itself; the reference must be a separate, frozen copy "
                "(pass ref_model=None to let the trainer make one, or copy.deepcopy(model))"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.reward_fns = list(fns)
        self.accuracy_fn = accuracy_fn
        self.config = config
        self.state = RunState()
        self.history: list[dict] = []
        # adaptive entropy control (Skywork-OR1): the coefficient, and the entropy of the last update (none yet)
        self._entropy_coef = float(config.entropy_coef)
        self._last_entropy = math.inf
        self._writers: tuple[HistoryWriter, CompletionsWriter] | None = None  # while train() appends
        #: Reuse the gradient pass's log-probs as the old policy's when a step makes
        #: exactly one update (stage 4 is then skipped). Tests switch it off to
        #: check that both paths give the same numbers.
        self.reuse_on_policy_logprobs = True

        if config.disable_dropout:
            disable_dropout(model)
        self.ref_model: torch.nn.Module | None = None
        if config.beta > 0:
            self.ref_model = ref_model if ref_model is not None else copy.deepcopy(model)
            self.ref_model.eval()
            self.ref_model.requires_grad_(False)
            if config.disable_dropout:
                disable_dropout(self.ref_model)

        self._params = trainable_parameters(model)
        self.optimizer, self.scheduler = make_optimizer(self._params, config)

    @property
    def step(self) -> int:
        """Completed training steps."""
        return self.state.step

    @property
    def skipped_updates(self) -> int:
        """Optimizer updates skipped for a non-finite loss or gradient, since the start."""
        return self.state.skipped_updates

    # ------------------------------------------------------------------ one step
    def train_step(self, batch: Sequence[dict], more_rows: Callable[[], list[dict]] | None = None) -> dict:
        """One GRPO step on ``batch`` (rows with ``prompt`` and ``answer``); returns its history row.

        ``more_rows`` (used by ``dynamic_sampling``) returns the next
        ``prompts_per_step`` rows of the data stream; :meth:`train` passes it.
        The row (its fields: :func:`~grpo_tutorial.metrics.step_row`) is also
        appended to :attr:`history`; it describes the groups the step trains on.
        """
        check_rows(batch, "batch")
        cfg, clock = self.config, StageClock()
        # stages 1-2: rollout and rewards (with dynamic sampling, more rounds until enough groups have a signal)
        sample = self._sample(batch, more_rows, clock)
        rollout = sample["rollout"]
        # stage 3: group-relative advantages, [N]
        advantages = self._advantages(sample).to(rollout.completion_ids.device)
        self._last_batch = (rollout.prompts, rollout.completions, sample["rewards"], sample["per_fn"], advantages)
        # stage 4: old log-probs (the policy that sampled), unless this step is exactly on-policy
        on_policy = self.reuse_on_policy_logprobs and cfg.updates_per_step == 1
        old_logp, entropy = (None, None) if on_policy else self._score(self.model, rollout, entropy=True)
        clock.lap("score")
        # stage 5: reference log-probs, only with a KL penalty, [N, Tc]
        ref_logp = None if self.ref_model is None else self._score(self.ref_model, rollout, entropy=False)
        clock.lap("reference")
        # stage 6: mu passes over shuffled minibatches, one optimizer update each
        update = self._update(rollout, old_logp, ref_logp, advantages, rollout.completion_mask)
        entropy = update["entropy"] if entropy is None else entropy  # [N, Tc]
        self.state.step += 1
        if self.ref_model is not None and cfg.ref_sync_every and self.step % cfg.ref_sync_every == 0:
            self.ref_model.load_state_dict(self.model.state_dict())
        clock.lap("update")
        # stage 7: the history row, and warnings about failure modes
        row = self._history_row(sample, update, entropy, clock)
        self.history.append(row)
        return row

    def _sample(self, batch: Sequence[dict], more_rows: Callable[[], list[dict]] | None, clock: StageClock) -> dict:
        """Stages 1-2, one round; with ``dynamic_sampling``, more rounds until the step has
        ``prompts_per_step`` groups with a learning signal (or ``max_sampling_rounds``)."""
        cfg = self.config
        rounds = [self._sample_round(batch, 0, clock)]
        while (
            cfg.dynamic_sampling and more_rows is not None and len(rounds) < cfg.max_sampling_rounds
            and sum(int((~r["zero_std"]).sum()) for r in rounds) < cfg.prompts_per_step
        ):
            extra = more_rows()
            check_rows(extra, "more_rows()")
            rounds.append(self._sample_round(extra, len(rounds), clock))
        chosen = rounds[0] if len(rounds) == 1 else keep_signal_groups(
            rounds, cfg.group_size, cfg.prompts_per_step, self._pad_id()
        )
        return {**chosen, "groups_drawn": sum(len(r["zero_std"]) for r in rounds)}

    def _sample_round(self, batch: Sequence[dict], round_: int, clock: StageClock) -> dict:
        """Stages 1 and 2 for one sampling round: the rollout, its rewards and which groups carry no signal."""
        cfg, G = self.config, self.config.group_size
        seed = stream_seed(cfg.seed, SAMPLING, self.step) if round_ == 0 else derive_seed(
            cfg.seed, RESAMPLING, self.step, round_
        )
        # stage 1: rollout, all B*G completions in one generate call
        rollout = self._rollout([row["prompt"] for row in batch], seed)  # N = B*G completions
        clock.lap("generate")

        # stage 2: rewards, [N] (NaN: no reward function could score the completion)
        answers = [row.get("answer") for row in batch for _ in range(G)]
        columns = extra_columns(batch, G)
        rewards, per_fn = compute_rewards(
            self.reward_fns, cfg.reward_weights, rollout.prompts, rollout.completions, answers,
            completion_ids=rollout.completion_id_lists(), **columns,
        )  # [N], {name: [N]}
        correct = judge_correct(self.accuracy_fn, rollout.prompts, rollout.completions, answers, columns)
        self._warn_unscorable(rewards)
        zero_std = zero_std_groups(rewards, G)  # [B]
        clock.lap("reward")
        return {"rollout": rollout, "rewards": rewards, "per_fn": per_fn, "correct": correct, "zero_std": zero_std}

    def _advantages(self, sample: dict) -> torch.Tensor:
        """Stage 3: group-relative advantages, [N] (GDPO: of each reward function, then of their weighted sum)."""
        cfg = self.config
        if cfg.multi_objective_aggregation == "normalize_then_sum":
            per_function = torch.stack(list(sample["per_fn"].values()), dim=1)  # [N, K]
            return normalize_then_sum(per_function, cfg.group_size, cfg.reward_weights, std=cfg.std)  # [N]
        return group_advantages(
            sample["rewards"], cfg.group_size, scale=cfg.scale_rewards, std=cfg.std, nan="skip",
            baseline=cfg.advantage_baseline,
        )  # [N]

    def _score(self, model: torch.nn.Module, rollout: Rollout, *, entropy: bool) -> Any:
        """Stages 4/5: log-probs (and entropy) of all N completions, eval mode, no gradient."""
        cfg = self.config
        return score_rollout(
            model, rollout, temperature=cfg.temperature, chunk=cfg.micro_size, return_entropy=entropy,
            share_prompts=cfg.share_prompt_cache,
        )

    def _history_row(self, sample: dict, update: dict, entropy: torch.Tensor, clock: StageClock) -> dict:
        """Stage 7: the step's history row, checked for failure modes."""
        cfg, rollout, rewards = self.config, sample["rollout"], sample["rewards"]
        row = step_row(
            step=self.step, rewards=rewards, per_function=reward_function_means(sample["per_fn"]),
            correct=sample["correct"], update_stats=update["stats"], losses=update["losses"],
            grad_norms=update["grad_norms"], entropy=entropy, mask=rollout.completion_mask,
            zero_std=zero_std_groups(rewards, cfg.group_size), truncated=rollout.truncated, lr=update["lr"],
            skipped_updates=self.skipped_updates, seconds={**clock.done(), **update["seconds"]},
        )
        row["groups_drawn"] = sample["groups_drawn"]
        if cfg.use_adaptive_entropy or cfg.entropy_coef != 0.0:
            row["entropy_coef"] = self._entropy_coef  # after the step's last update, as TRL logs it
        check_failure_modes(
            row, self.history, group_size=cfg.group_size, learning_rate=cfg.learning_rate,
            max_new_tokens=cfg.max_new_tokens, warn=self.state.warn,
        )
        return row

    def _pad_id(self) -> int:
        pad = getattr(self.tokenizer, "pad_token_id", None)
        return self.tokenizer.eos_token_id if pad is None else pad

    def _rollout(self, prompts: list, generator_seed: int) -> Rollout:
        cfg = self.config
        return generate_rollouts(
            self.model, self.tokenizer, prompts, group_size=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature, top_p=cfg.top_p, do_sample=True, system_prompt=cfg.system_prompt,
            use_chat_template=cfg.use_chat_template, generator_seed=generator_seed, onednn=cfg.onednn_generation,
        )

    def _warn_unscorable(self, rewards: torch.Tensor) -> None:
        unscorable = int(torch.isnan(rewards).sum())
        if unscorable:
            self.state.warn(
                "unscorable",
                f"{unscorable} of {len(rewards)} completions could not be scored (every reward function "
                "returned None); they are left out of their group's baseline and of reward_mean, "
                "and get an advantage of 0",
            )

    def _update(
        self,
        rollout: Rollout,
        old_logp: torch.Tensor | None,
        ref_logp: torch.Tensor | None,
        advantages: torch.Tensor,
        mask: torch.Tensor,
    ) -> dict:
        """Stage 6: mu passes of optimizer updates over shuffled minibatches.

        Each update's gradient is accumulated over micro-batches of
        ``micro_batch_size`` completions, with the loss type's normaliser for the
        whole update (see :mod:`grpo_tutorial.objectives`). With ``old_logp`` None
        (an on-policy step: one update) the old log-probs are the gradient pass's
        own, detached, and the entropy comes from the same pass.
        """
        cfg = self.config
        N, size, micro = len(rollout), cfg.update_size, cfg.micro_size
        shuffle = stream_generator(cfg.seed, MINIBATCHES, self.step)
        out: dict[str, Any] = {"stats": [], "losses": [], "grad_norms": [], "entropy": None}
        out["seconds"] = {"forward_seconds": 0.0, "backward_seconds": 0.0, "optimizer_seconds": 0.0}
        out["lr"] = float(self.optimizer.param_groups[0]["lr"])
        if old_logp is None:  # filled by each micro-batch's pass; NaN: a row no pass reached (skipped update)
            out["entropy"] = torch.full(mask.shape, math.nan, dtype=torch.float32, device=mask.device)  # [N, Tc]
        was_training = self.model.training
        self.model.train()
        try:
            for _ in range(cfg.num_iterations):
                order = torch.randperm(N, generator=shuffle).to(advantages.device)  # [N]
                for start in range(0, N, size):
                    rows = order[start : start + size]  # [M] one optimizer update
                    out["lr"] = float(self.optimizer.param_groups[0]["lr"])
                    self.optimizer.zero_grad(set_to_none=True)
                    loss = self._accumulate(rollout, rows, micro, old_logp, ref_logp, advantages, mask, out)
                    out["losses"].append(loss)
                    if not math.isfinite(loss):
                        out["grad_norms"].append(math.nan)
                        self.optimizer.zero_grad(set_to_none=True)
                        self._skip_update(f"the loss is {loss}")
                        continue
                    started = time.perf_counter()
                    norm = clip_and_step(self._params, self.optimizer, self.scheduler, cfg.max_grad_norm)
                    out["grad_norms"].append(norm)
                    if not math.isfinite(norm):
                        self._skip_update(f"the gradient norm is {norm}")
                    out["seconds"]["optimizer_seconds"] += time.perf_counter() - started
        finally:
            self.model.train(was_training)
        return out

    def _accumulate(self, rollout, rows, micro, old_logp, ref_logp, advantages, mask, out) -> float:
        """Backward over the micro-batches of one update; return the update's loss.

        Stops at the first non-finite micro-batch loss (the caller then skips
        the update), so no NaN gradient is ever accumulated. When the loss uses
        the entropy (``top_entropy_quantile``, ``entropy_coef``), it is the
        current policy's, from this gradient pass, with its gradient (as TRL).
        """
        cfg = self.config
        options = cfg.loss_options()  # stage 6's settings, one validated object
        if cfg.use_adaptive_entropy:  # this update's coefficient: the controller's, if the entropy is low
            coef = applied_entropy_coef(self._entropy_coef, self._last_entropy, cfg.entropy_target)
            options = dataclasses.replace(options, entropy_coef=coef)
        measure = options.needs_entropy or cfg.use_adaptive_entropy  # grpo_loss gets (and sums) the entropies
        entropy_sum, entropy_tokens = 0.0, 0.0
        steps = len(rows) // micro
        truncated = rollout.truncated.to(mask.device)  # [N]
        counted = mask * (~truncated)[:, None].to(mask.dtype) if options.mask_truncated_completions else mask  # [N, Tc]
        tokens = counted[rows].sum()  # the whole update's counted tokens: dapo's (and cispo's) normaliser
        total = 0.0
        seconds = out["seconds"]
        for start in range(0, len(rows), micro):
            started = time.perf_counter()
            part = rows[start : start + micro]  # [m]
            with_entropy = old_logp is None or measure
            scored = rollout_logprobs(
                self.model, rollout, part, temperature=cfg.temperature, return_entropy=with_entropy,
                entropy_grad=options.needs_entropy, share_prompts=cfg.share_prompt_cache,
            )
            logp, entropies = scored if with_entropy else (scored, None)  # [m, Tc] x2
            if old_logp is None:
                out["entropy"][part] = entropies.detach().float()
            old = logp.detach() if old_logp is None else old_logp[part]  # [m, Tc]
            loss, stats = grpo_loss(
                logp, old, advantages[part], mask[part], options=options,
                ref_logp=None if ref_logp is None else ref_logp[part], truncated=truncated[part],
                entropies=entropies if measure else None,
                gradient_accumulation_steps=steps, num_items_in_batch=tokens,
            )
            out["stats"].append(stats)
            if measure:
                entropy_sum, entropy_tokens = entropy_sum + stats["entropy_sum"], entropy_tokens + stats["entropy_tokens"]
            value = float(loss.detach())
            total += value
            seconds["forward_seconds"] += time.perf_counter() - started
            if not math.isfinite(value):
                return value
            started = time.perf_counter()
            loss.backward()
            seconds["backward_seconds"] += time.perf_counter() - started
        if cfg.use_adaptive_entropy:  # the update's entropy sets the next update's coefficient
            self._last_entropy = entropy_sum / max(entropy_tokens, 1.0)
            self._entropy_coef = adapt_entropy_coef(
                self._entropy_coef, self._last_entropy, target=cfg.entropy_target, delta=cfg.entropy_coef_delta,
                coef_min=cfg.entropy_coef_min, coef_max=cfg.entropy_coef_max,
            )
        return total

    def _skip_update(self, reason: str) -> None:
        self.state.skipped_updates += 1
        self.state.warn(
            "nonfinite",
            f"step {self.step + 1}: {reason}; skipped this optimizer update (gradients zeroed). "
            "Training continues and history['skipped_updates'] counts the skips. If it keeps "
            "happening, lower learning_rate, check the reward functions, or use float32.",
        )

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, output_dir: str | os.PathLike | None = None) -> Path:
        """Write ``output_dir/checkpoint/`` atomically and return its path.

        The history is not stored in the checkpoint: it lives in
        ``output_dir/history.jsonl`` (rewritten here, unless :meth:`train` is
        appending to it right now: then it is synced).
        """
        root = Path(output_dir if output_dir is not None else self._require_output_dir("save_checkpoint"))
        if self._writers is not None and self._writers[0].output_dir == root:
            for writer in self._writers:
                writer.sync()  # the rows the checkpoint's step covers are on disk before it
        else:
            with disk_errors(root, root):
                root.mkdir(parents=True, exist_ok=True)
            write_history(root / HISTORY_FILE, self.history)
        state = training_state(self.model, self.optimizer, self.scheduler, self.ref_model)
        meta = {
            **self.state.to_meta(),
            "data_seed": self.config.seed,
            "entropy_control": {  # adaptive entropy control's state (None: no entropy measured yet)
                "coef": self._entropy_coef,
                "last_entropy": None if math.isinf(self._last_entropy) else self._last_entropy,
            },
            "config": self.config.to_dict(),
        }
        return write_checkpoint(root, state, meta)

    def load_checkpoint(self, output_dir: str | os.PathLike | None = None) -> bool:
        """Restore everything from the last checkpoint; False if there is none.

        The history is read back from ``history.jsonl`` and cut to the
        checkpoint's step (rows written after the checkpoint are redone).
        """
        root = Path(output_dir if output_dir is not None else self._require_output_dir("load_checkpoint"))
        path = find_checkpoint(root)
        if path is None:
            return False
        state, meta = read_checkpoint(path)
        changed = config_changes(meta["config"], self.config.to_dict(), GRPOConfig().to_dict())
        if changed:
            self._warn_now(f"resuming from {path} with a different config ({changed}); the resumed run will not "
                           "match an uninterrupted one")
        if not restore_training_state(state, self.model, self.optimizer, self.scheduler, self.ref_model):
            self._warn_now(f"checkpoint {path} holds no reference model (it was saved with beta=0); "
                           "the reference stays as it is now")
        self.state = RunState.from_meta(meta)
        control = meta.get("entropy_control") or {"coef": self.config.entropy_coef, "last_entropy": None}
        self._entropy_coef = float(control["coef"])
        self._last_entropy = math.inf if control["last_entropy"] is None else float(control["last_entropy"])
        self.history = history_until(root, meta)
        return True

    @staticmethod
    def _warn_now(message: str) -> None:
        """A :class:`GRPOWarning` that is not limited to once per run, pointed at the caller's line."""
        warnings.warn(message, GRPOWarning, stacklevel=caller_stacklevel())

    def _require_output_dir(self, what: str) -> str:
        if self.config.output_dir is None:
            raise ValueError(f"{what} needs a directory: set GRPOConfig.output_dir or pass output_dir=...")
        return self.config.output_dir

    # ------------------------------------------------------------------ the loop
    def train(
        self,
        dataset: Sequence[dict],
        steps: int,
        *,
        resume: bool = False,
        progress: bool = True,
    ) -> list[dict]:
        """Train until ``steps`` steps have been taken in total; return the history.

        ``steps`` is the total, not a count of new steps: a resumed run and an
        uninterrupted one with the same arguments end at the same step, and a
        second ``train(ds, 200)`` on a trainer already at step 100 runs 100 more.

        Each step's row is appended to ``output_dir/history.jsonl`` and flushed.
        A checkpoint is saved every ``checkpoint_every`` steps and at the end.

        Args:
            dataset: rows with ``prompt`` (and ``answer``) keys.
            steps: the total number of steps to reach (> 0).
            resume: load ``output_dir/checkpoint`` first (if there is none,
                start from scratch with a warning). ``history.jsonl`` is cut back
                to the checkpoint's step, and the later steps are redone exactly.
            progress: show a tqdm bar with the reward, the batch accuracy and the
                KL (each only when the step computed it).

        Ctrl-C: the current step finishes, a checkpoint is saved (if output_dir
        is set), and ``KeyboardInterrupt`` is raised. The trainer is then
        consistent, so calling ``train`` again continues. A second Ctrl-C
        aborts the step at once; resume from the last checkpoint then.
        """
        with run_lock(self.config.output_dir):  # one run per output directory (run/lock.py)
            return self._train(dataset, steps, resume=resume, progress=progress)

    def _train(self, dataset: Sequence[dict], steps: int, *, resume: bool, progress: bool) -> list[dict]:
        dataset = self._begin(dataset, steps, resume=resume)
        cfg = self.config
        out = Path(cfg.output_dir) if cfg.output_dir is not None else None
        with HistoryWriter(out, self.history) as history, \
                CompletionsWriter(out, self.step, enabled=cfg.log_completions) as completions:
            self._writers = (history, completions)
            bar = progress_bar(total=steps, desc="GRPO", initial=min(self.step, steps), unit="step",
                               dynamic_ncols=True) if progress else None
            saved_at = self.step  # nothing new to save unless a step runs
            try:
                with StopAfterStep() as stop:
                    while self.step < steps:
                        row = self._next_step(dataset)
                        history.append(row)
                        if bar is not None:  # every step's numbers: on a GPU a step takes seconds to minutes
                            bar.update(1)
                            bar.set_postfix(postfix(row, PROGRESS_FIELDS))
                        if cfg.log_completions and self.step % cfg.log_every == 0:
                            self._log_completions(completions, bar)
                        if out is not None and cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                            self.save_checkpoint(out)
                            saved_at = self.step
                        if stop.requested:
                            saved = f"checkpoint saved to {self.save_checkpoint(out)}" if out is not None else (
                                "no output_dir, nothing saved")
                            raise KeyboardInterrupt(f"training interrupted after step {self.step}; {saved}")
                if out is not None and cfg.checkpoint_every and saved_at != self.step:
                    self.save_checkpoint(out)
            finally:
                self._writers = None
                if bar is not None:
                    bar.close()
        return self.history

    def _begin(self, dataset: Sequence[dict], steps: int, *, resume: bool) -> list[dict]:
        """Check the arguments, load the checkpoint for ``resume``, and tie the run to this dataset."""
        dataset = as_rows(dataset)
        validate_for_model(dataset, self.model, self.tokenizer, self.config.max_new_tokens)
        if not is_int(steps) or steps < 1:
            raise ValueError(f"steps must be a positive int, got {steps!r}")
        out = self.config.output_dir
        fingerprint = dataset_fingerprint(dataset)
        if resume:
            if out is None:
                raise ValueError("train(resume=True) needs GRPOConfig.output_dir, where the checkpoint lives")
            saved = find_checkpoint(out)
            if saved is not None:  # refuse a different dataset before touching any state
                self._check_dataset(fingerprint, read_meta(saved).get("dataset_fingerprint"), f"the checkpoint in {out!r}")
            if not self.load_checkpoint(out):
                self._warn_now(f"resume=True but no checkpoint in {out!r}; starting from step 0")
        elif out is not None and self.step == 0 and find_checkpoint(out) is not None:
            self._warn_now(f"{out!r} already holds a checkpoint; starting a new run from step 0 that will "
                           "replace it at its first save (pass resume=True to continue the old run instead)")
        where = f"the checkpoint in {out!r}" if out is not None else "this trainer's earlier train() calls"
        self._check_dataset(fingerprint, self.state.dataset_fingerprint, where)
        self.state.dataset_fingerprint = fingerprint
        return dataset

    @staticmethod
    def _check_dataset(fingerprint: str, trained_on: str | None, where: str) -> None:
        if trained_on not in (None, fingerprint):
            raise ValueError(
                f"the dataset differs from the one {where} trained on (fingerprint {fingerprint} vs "
                f"{trained_on}); train on the same dataset, or start a new trainer (and output_dir) for a new one"
            )

    def _next_step(self, dataset: list[dict]) -> dict:
        """One step on the next rows of the data stream; the data position moves only after a good step."""
        cfg = self.config
        position = [self.state.epoch, self.state.index]

        def draw() -> list[dict]:  # the next rows of the data stream; every draw advances it
            rows, position[0], position[1] = next_batch(dataset, cfg.prompts_per_step, cfg.seed, *position)
            return rows

        # more_rows only when used, so a wrapped train_step(batch) keeps working
        row = self.train_step(draw(), more_rows=draw) if cfg.dynamic_sampling else self.train_step(draw())
        self.state.epoch, self.state.index = position
        return row

    def _log_completions(self, writer: CompletionsWriter, bar: Any) -> None:
        """``log_completions``: this step's sample of completions, to ``completions.jsonl`` and the console."""
        prompts, completions, rewards, per_fn, advantages = self._last_batch
        rows = sample_completions(
            self.step, prompts, completions, rewards.tolist(), {k: v.tolist() for k, v in per_fn.items()},
            advantages.tolist(), count=self.config.num_completions_to_print, seed=self.config.seed,
        )
        writer.show(rows, total=len(completions), bar=bar)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, dataset: Sequence[dict], *, batch_size: int | None = None, num_samples: int = 3) -> dict:
        """:func:`~grpo_tutorial.evaluation.evaluate_policy` with this trainer's model, rewards and config.

        The prompt, chat template, token budget and batch size are the ones the
        trainer samples with. Returns ``accuracy`` and ``se``, ``reward_mean``,
        ``completion_len_mean``, ``frac_truncated``, ``n``, ``seconds``,
        ``correct`` and ``completions`` (one per row), ``records`` and
        ``samples`` (the first ``num_samples`` prompt/completion/answer dicts).
        """
        return evaluate_policy(
            self.model, self.tokenizer, dataset, self.config, reward_fns=self.reward_fns,
            accuracy_fn=self.accuracy_fn, batch_size=batch_size, num_samples=num_samples,
        )
