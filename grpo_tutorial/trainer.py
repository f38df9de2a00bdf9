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

import math
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ._checks import is_int
from .advantages import group_advantages, normalize_then_sum, zero_std_groups
from .config import GRPOConfig
from .evaluation import evaluate_policy
from .logprobs import rollout_logprobs, score_rollout
from .loss import grpo_loss, update_normalisers
from .metrics import TIMING_KEYS, StageClock, check_failure_modes, step_row, timed
from .models import disable_dropout, frozen_reference
from .objectives import EntropyControl
from .optim import finish_update, make_optimizer, trainable_parameters
from .rewards import (
    check_unscorable, compute_rewards, extra_columns, judge_correct, reward_function_list, reward_function_means,
)
from .rollout import Rollout, generate_rollouts, keep_signal_groups
from .run.checkpoint import load_model_state, load_training, resume_or_start, save_training
from .run.completions import CompletionsWriter, sample_completions
from .run.history import HistoryWriter, history_until, read_history
from .run.interrupt import StopAfterStep
from .run.layout import find_checkpoint
from .run.lock import run_lock
from .run.progress import postfix, progress_bar
from .run.state import RunState, dataset_fingerprint
from .run.warn import GRPOWarning
from .seeding import DataStream, minibatches, sampling_seed
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
        self._entropy = EntropyControl.from_config(config)  # the entropy bonus's coefficient (adaptive: it moves)
        self._writers: tuple[HistoryWriter, CompletionsWriter] | None = None  # while train() appends
        #: Reuse the gradient pass's log-probs as the old policy's when a step makes
        #: exactly one update (stage 4 is then skipped). Tests switch it off to
        #: check that both paths give the same numbers.
        self.reuse_on_policy_logprobs = True

        if config.disable_dropout:
            disable_dropout(model)
        self.ref_model: torch.nn.Module | None = None  # only with a KL penalty: the given one, or a copy of the policy
        if config.beta > 0:
            self.ref_model = frozen_reference(model, ref_model, without_dropout=config.disable_dropout)
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
        seed = sampling_seed(cfg.seed, self.step, round_)  # round 0: the SAMPLING stream; later ones: RESAMPLING
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
        check_unscorable(rewards, self.state.warn)
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
            row["entropy_coef"] = self._entropy.coef  # after the step's last update, as TRL logs it
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
        out: dict[str, Any] = {"stats": [], "losses": [], "grad_norms": [], "entropy": None}
        out["seconds"] = {"forward_seconds": 0.0, "backward_seconds": 0.0, "optimizer_seconds": 0.0}
        out["lr"] = float(self.optimizer.param_groups[0]["lr"])
        if old_logp is None:  # filled by each micro-batch's pass; NaN: a row no pass reached (skipped update)
            out["entropy"] = torch.full(mask.shape, math.nan, dtype=torch.float32, device=mask.device)  # [N, Tc]
        updates = minibatches(len(rollout), cfg.update_size, cfg.num_iterations, cfg.seed, self.step, advantages.device)
        was_training = self.model.training
        self.model.train()
        try:
            for rows in updates:  # [M] the completions of one optimizer update
                out["lr"] = float(self.optimizer.param_groups[0]["lr"])
                self.optimizer.zero_grad(set_to_none=True)
                loss = self._accumulate(rollout, rows, old_logp, ref_logp, advantages, mask, out)
                with timed(out["seconds"], "optimizer_seconds"):  # a non-finite loss or norm: no update
                    norm, skipped = finish_update(self._params, self.optimizer, self.scheduler, cfg.max_grad_norm, loss)
                out["losses"].append(loss)
                out["grad_norms"].append(norm)
                if skipped is not None:  # history['skipped_updates'] counts it; the warning comes once per run
                    self.state.skipped_updates += 1
                    self.state.warn("nonfinite", f"step {self.step + 1}: {skipped}")
        finally:
            self.model.train(was_training)
        return out

    def _accumulate(self, rollout, rows, old_logp, ref_logp, advantages, mask, out) -> float:
        """Backward over the micro-batches of one update; return the update's loss.

        Stops at the first non-finite micro-batch loss (the caller then skips
        the update), so no NaN gradient is ever accumulated. When the loss uses
        the entropy (``top_entropy_quantile``, ``entropy_coef``), it is the
        current policy's, from this gradient pass, with its gradient (as TRL).
        """
        cfg, micro, first = self.config, self.config.micro_size, len(out["stats"])  # this update's stats start at first
        options = self._entropy.loss_options(cfg.loss_options())  # stage 6's settings, this update's entropy coef
        measure = options.needs_entropy or cfg.use_adaptive_entropy  # grpo_loss gets (and sums) the entropies
        with_entropy = old_logp is None or measure  # the scoring pass returns the entropies
        truncated = rollout.truncated.to(mask.device)  # [N]
        normalisers = update_normalisers(options, mask, truncated, rows, micro)  # of the whole update: K, its tokens
        total = 0.0
        for start in range(0, len(rows), micro):
            part = rows[start : start + micro]  # [m]
            with timed(out["seconds"], "forward_seconds"):
                scored = rollout_logprobs(
                    self.model, rollout, part, temperature=cfg.temperature, return_entropy=with_entropy,
                    entropy_grad=options.needs_entropy, share_prompts=cfg.share_prompt_cache,
                )
                logp, entropies = scored if with_entropy else (scored, None)  # [m, Tc] x2
                if old_logp is None:
                    out["entropy"][part] = entropies.detach().float()
                loss, stats = grpo_loss(
                    logp, logp.detach() if old_logp is None else old_logp[part], advantages[part], mask[part],
                    options=options, ref_logp=None if ref_logp is None else ref_logp[part], truncated=truncated[part],
                    entropies=entropies if measure else None, **normalisers,
                )
                out["stats"].append(stats)
                value = float(loss.detach())
            total += value
            if not math.isfinite(value):
                return value
            with timed(out["seconds"], "backward_seconds"):
                loss.backward()
        self._entropy.measured(out["stats"][first:])  # adaptive: the update's entropy sets the next coefficient
        return total

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, output_dir: str | os.PathLike | None = None) -> Path:
        """Write ``output_dir/checkpoint/`` atomically and return its path.

        The history is not stored in the checkpoint: it lives in
        ``output_dir/history.jsonl`` (rewritten here, unless :meth:`train` is
        appending to it right now: then it is synced).
        """
        meta = {
            **self.state.to_meta(),
            "data_seed": self.config.seed,
            "entropy_control": self._entropy.to_meta(),  # adaptive entropy control's state
            "config": self.config.to_dict(),
        }
        return save_training(
            self._run_dir(output_dir, "save_checkpoint"), self.model, self.optimizer, self.scheduler, self.ref_model,
            meta=meta, history=self.history, appending=self._writers or (),
        )

    def load_checkpoint(self, output_dir: str | os.PathLike | None = None) -> bool:
        """Restore everything from the last checkpoint; False if there is none.

        The history is read back from ``history.jsonl`` and cut to the
        checkpoint's step (rows written after the checkpoint are redone).
        """
        root = self._run_dir(output_dir, "load_checkpoint")
        meta = load_training(
            root, self.model, self.optimizer, self.scheduler, self.ref_model,
            config=self.config.to_dict(), defaults=GRPOConfig().to_dict(),
        )
        if meta is None:
            return False
        self.state = RunState.from_meta(meta)
        self._entropy = EntropyControl.from_config(self.config, meta.get("entropy_control"))
        self.history = history_until(root, meta)
        return True

    def _run_dir(self, output_dir: str | os.PathLike | None, what: str) -> Path:
        """``output_dir``, or the config's; refused if neither is set."""
        if output_dir is None and self.config.output_dir is None:
            raise ValueError(f"{what} needs a directory: set GRPOConfig.output_dir or pass output_dir=...")
        return Path(output_dir if output_dir is not None else self.config.output_dir)

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
        out, fingerprint = self.config.output_dir, dataset_fingerprint(dataset)
        resume_or_start(out, fingerprint, resume=resume, fresh=self.step == 0, load=self.load_checkpoint)
        self.state.use_dataset(fingerprint, f"the checkpoint in {out!r}" if out is not None else (
            "this trainer's earlier train() calls"))
        return dataset

    def _next_step(self, dataset: list[dict]) -> dict:
        """One step on the next rows of the data stream; the data position moves only after a good step."""
        cfg = self.config
        stream = DataStream(dataset, cfg.prompts_per_step, cfg.seed, self.state.epoch, self.state.index)
        if cfg.dynamic_sampling:
            row = self.train_step(stream.draw(), more_rows=stream.draw)
        else:  # more_rows only when used, so a wrapped train_step(batch) keeps working
            row = self.train_step(stream.draw())
        self.state.epoch, self.state.index = stream.epoch, stream.index
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
