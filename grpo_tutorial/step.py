"""One GRPO step, top to bottom: the five stages of :mod:`grpo_tutorial.stages`, beside chapter 0's loop.

:meth:`GRPOStep.__call__` is the whole step, one call per stage, its comments in
the order and the words of chapter 0's loop (``tests/test_stages.py`` checks them):
1. sample (rollout.py), 2. reward (rewards.py), 3. advantages (advantages.py),
4. score (logprobs.py: the sampling policy's log-probs, skipped when the step is
exactly on-policy, and the reference's), 5. update (loss.py, optim.py: mu passes
over shuffled minibatches, one optimizer update each, accumulated over
micro-batches); then the history row and its warnings (metrics.py), with the
seconds of each stage under its name (``sample_seconds`` ... ``update_seconds``).
With ``dynamic_sampling`` (DAPO) stages 1 and 2 run again on more prompts until
enough groups carry a signal (:func:`~grpo_tutorial.dynamic_sampling.more_rounds`).

It imports nothing from :mod:`grpo_tutorial.run`: the loop around the step, its
checkpoints, history file and progress bar are
:class:`~grpo_tutorial.trainer.GRPOTrainer`'s. Two extension points let new
pieces plug in without growing the step: :class:`~grpo_tutorial.models.Policies` supplies the policy
and its reference (:class:`~grpo_tutorial.lora.AdapterPolicies`: the policy
with its LoRA adapters switched off, no copy), and ``sampler``, a
:class:`~grpo_tutorial.sampling.Sampler` (``(prompts, seed) -> Rollout``, synced after
every update), writes the completions (default: the policy itself; on a GPU, sampled fast;
a sampler that is not the learner, ``config.sampler``: all of them :mod:`grpo_tutorial.sampling`'s).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch

from .advantages import group_advantages, normalize_then_sum, zero_std_groups
from .config import GRPOConfig
from .dynamic_sampling import more_rounds
from .logprobs import rollout_logprobs, score_rollout
from .loss import grpo_loss, update_normalisers
from .metrics import StageClock, history_row, timed
from .mismatch import loss_inputs, sampler_correction
from .models import Policies, disable_dropout
from .objectives import EntropyControl
from .optim import finish_update, make_optimizer, trainable_parameters
from .rewards import check_unscorable, compute_rewards, extra_columns, judge_correct, reward_function_list
from .rollout import Rollout, pad_token_id
from .sampling import FunctionSampler, Sampler, as_sampler, build_sampler
from .tools import NO_TOOLS_FOR_A_FUNCTION, tool_box
from .seeding import minibatches, sampling_seed
from .stage_results import Advantages, Rewards, Scores, Updates
from .tasks import check_rows

__all__ = ["GRPOStep", "Policies", "Sampler"]


class GRPOStep:
    """One GRPO step as a callable: ``row = grpo_step(batch, state, history)``.

    It holds what the stages need across steps: the policies, the reward
    functions, the optimizer and its schedule, the entropy coefficient. ``state``
    is where the run stands (the trainer's :class:`~grpo_tutorial.run.state.RunState`:
    anything with ``step``, ``skipped_updates`` and ``warn(kind, message)``);
    the call advances ``state.step``. Arguments as :class:`~grpo_tutorial.trainer.GRPOTrainer`'s.
    """

    def __init__(self, model, tokenizer, reward_fns, config: GRPOConfig | None = None, ref_model=None, *,
                 accuracy_fn: Callable | None = None, sampler: Sampler | Callable[[list, int], Rollout] | None = None,
                 policies: Policies | None = None, tools: Sequence[Callable] | None = None) -> None:
        config = GRPOConfig() if config is None else config
        if not isinstance(config, GRPOConfig):
            raise TypeError(f"config must be a GRPOConfig, got {type(config).__name__}")
        self.reward_fns = list(reward_function_list(reward_fns, config.reward_weights))
        if getattr(tokenizer, "eos_token_id", None) is None:
            raise ValueError("tokenizer.eos_token_id is None; the trainer needs an EOS token")
        if accuracy_fn is not None and not callable(accuracy_fn):
            raise TypeError(f"accuracy_fn must be None or a function, got {type(accuracy_fn).__name__}")
        if ref_model is not None and ref_model is model:
            raise ValueError("ref_model is the policy itself; the reference must be a separate, frozen copy "
                             "(pass ref_model=None to let the trainer make one, or copy.deepcopy(model))")
        self.tokenizer, self.config, self.accuracy_fn = tokenizer, config, accuracy_fn
        if config.disable_dropout:
            disable_dropout(model)
        self.policies = Policies.default(model, ref_model, config) if policies is None else policies
        self.toolbox = tool_box(tools, tokenizer, config)  # None: no tools
        self.sampler = build_sampler(sampler, self.policies.policy, tokenizer, config)  # the setter hands it the tools
        self.entropy_control = EntropyControl.from_config(config)  # the entropy bonus's coefficient (adaptive: it moves)
        self.params = trainable_parameters(model)
        self.optimizer, self.scheduler = make_optimizer(self.params, config)
        #: Reuse the gradient pass's log-probs as the old policy's when a step makes exactly one
        #: update (stage 4's old-policy pass is then skipped). Tests switch it off to compare both paths.
        self.reuse_on_policy_logprobs = True
        self.last_batch: tuple | None = None  # (prompts, completions, rewards, per_fn, advantages) of the last step
        #: The last step's completions beyond ``last_batch``, one entry per completion: ``answers`` (the rows'
        #: reference answers), ``truncated``, ``lengths`` (the policy's tokens), ``tool_calls`` and
        #: ``tool_failures`` (None without tools). The run keeps a sample of them (:mod:`grpo_tutorial.run.completions`).
        self.last_details: dict | None = None

    @property
    def model(self) -> torch.nn.Module:
        return self.policies.policy

    @property
    def sampler(self) -> Sampler:
        """What writes the step's completions (stage 1), a :class:`~grpo_tutorial.sampling.Sampler`; the step's tools
        are its. Set it to a sampler, a plain ``(prompts, seed) -> Rollout`` function, or None (the default)."""
        return self._sampler

    @sampler.setter
    def sampler(self, given: Any) -> None:
        policy = self.policies.policy
        sampler = build_sampler(None, policy, self.tokenizer, self.config) if given is None else as_sampler(given, policy)
        if isinstance(sampler, FunctionSampler):  # it writes whole completions: it cannot pause for a call
            if self.toolbox is not None:
                raise ValueError(NO_TOOLS_FOR_A_FUNCTION)
        else:
            sampler.toolbox = self.toolbox  # None: this step has no tools (whatever the sampler held before)
        self._sampler = sampler

    # ------------------------------------------------------------------ what a checkpoint keeps of the step
    def extra_state(self) -> dict:
        """What the step holds beyond the policy, its optimizer and schedule (saved in every checkpoint): GRPO's step
        holds nothing more; a step with a value model holds it and its optimizer
        (:class:`~grpo_tutorial.ppo.step.PPOStep`)."""
        return {}

    def load_extra_state(self, state: dict) -> None:
        """Undo :meth:`extra_state` from a checkpoint (``{}`` where it held nothing more)."""

    def __call__(self, batch: Sequence[dict], state: Any, history: Sequence[dict],
                 more_rows: Callable[[], list[dict]] | None = None) -> dict:
        """One step on ``batch`` (rows with ``prompt`` and ``answer``); returns its history row."""
        check_rows(batch, "batch")
        cfg, clock = self.config, StageClock()
        # 1. sample: all B*G completions in one generate call, N = B*G
        rollout = self.sample(batch, state.step)
        clock.lap("sample")
        # 2. reward: [N] (NaN: no reward function could score the completion), and the groups without a signal
        rewards = self.reward(batch, rollout, state)
        clock.lap("reward")
        if cfg.dynamic_sampling and more_rows is not None:  # DAPO: 1 and 2 again, on more prompts, for more signal
            rewards = more_rounds(rewards, lambda k: self.again(k, more_rows, state, clock), cfg,
                                  pad_token_id(self.tokenizer))
        rollout = rewards.rollout
        # 3. advantages: each reward against its group (by default a z-score), [N]
        advantages = self.advantages(rewards).to(rollout.completion_ids.device)
        clock.lap("advantages")
        # 4. score: the sampling policy's log-probs (unless exactly on-policy), a sampler copy's, the reference's
        scores = self.score(rollout) if advantages.scores is None else advantages.scores  # PPO's KL reward: at 3
        clock.lap("score")
        # 5. update: mu passes over shuffled minibatches, one optimizer update each
        updates = self.update(rollout, scores, advantages, state)
        state.step += 1  # completed steps: the step that ran was number state.step
        if cfg.beta > 0 and cfg.ref_sync_every and state.step % cfg.ref_sync_every == 0:
            self.policies.sync_reference()
        clock.lap("update")
        self.last_batch = (rollout.prompts, rollout.completions, rewards.rewards, rewards.per_fn,
                           advantages.per_completion())
        self.last_details = completion_details(rollout, rewards.answers)
        # after the step: the history row (its entropy: stage 4's pass, or on-policy the update's own) and warnings
        seconds = {**clock.done(), **scores.seconds, **updates.seconds}
        row = history_row(cfg, rewards, scores, updates, seconds, state, history, entropy_coef=self.entropy_control.coef)
        return {**row, **advantages.row, **updates.row}  # what a stage of its own adds (PPO's value model, say)

    # ------------------------------------------------------------------ 1. sample
    def sample(self, batch: Sequence[dict], step: int, round_: int = 0) -> Rollout:
        """Stage 1: G completions for each prompt of ``batch``, written by the sampler (default: the policy)."""
        seed = sampling_seed(self.config.seed, step, round_)  # round 0: the SAMPLING stream; later ones: RESAMPLING
        return self.sampler([row["prompt"] for row in batch], seed)  # N = B*G completions

    # ------------------------------------------------------------------ 2. reward
    def reward(self, batch: Sequence[dict], rollout: Rollout, state: Any) -> Rewards:
        """Stage 2: the rollout's rewards ``[N]`` (and each function's), whether each is right, the zero-std groups."""
        cfg, G = self.config, self.config.group_size
        answers = [row.get("answer") for row in batch for _ in range(G)]
        columns = extra_columns(batch, G)
        rewards, per_fn = compute_rewards(
            self.reward_fns, cfg.reward_weights, rollout.prompts, rollout.completions, answers,
            completion_ids=rollout.completion_id_lists(), **columns,
        )  # [N], {name: [N]}
        correct = judge_correct(self.accuracy_fn, rollout.prompts, rollout.completions, answers, columns)
        check_unscorable(rewards, state.warn)
        zero_std = zero_std_groups(rewards, G)  # [B]
        return Rewards(rollout, rewards, per_fn, correct, answers, zero_std, len(zero_std), columns, state.step)

    def again(self, round_: int, more_rows: Callable[[], list[dict]], state: Any, clock: StageClock) -> Rewards:
        """Dynamic sampling's round ``round_``: stages 1 and 2 on ``more_rows()``."""
        batch = more_rows()
        check_rows(batch, "more_rows()")
        rollout = self.sample(batch, state.step, round_)
        clock.lap("sample")
        rewards = self.reward(batch, rollout, state)
        clock.lap("reward")
        return rewards

    # ------------------------------------------------------------------ 3. advantages
    def advantages(self, rewards: Rewards) -> Advantages:
        """Stage 3: group-relative advantages, [N] (GDPO: of each reward function, then of their weighted sum)."""
        cfg = self.config
        if cfg.multi_objective_aggregation == "normalize_then_sum":
            per_function = torch.stack(list(rewards.per_fn.values()), dim=1)  # [N, K]
            return Advantages(normalize_then_sum(per_function, cfg.group_size, cfg.reward_weights, std=cfg.std))  # [N]
        return Advantages(group_advantages(rewards.rewards, cfg.group_size, scale=cfg.scale_rewards, std=cfg.std,
                                           nan="skip", baseline=cfg.advantage_baseline))  # [N]

    # ------------------------------------------------------------------ 4. score
    def score(self, rollout: Rollout) -> Scores:
        """Stage 4, no gradient: the sampling policy's log-probs and entropy (``old_logp``, ``entropy``, [N, Tc];
        None when the step is exactly on-policy: the update's own pass gives them), a sampler copy's importance
        ``weights`` and ``mismatch`` fields (:mod:`~grpo_tutorial.mismatch`), the reference's ``ref_logp``
        (None without a KL penalty) and the seconds of that pass."""
        cfg, seconds = self.config, {"reference_seconds": 0.0}
        on_policy = self.reuse_on_policy_logprobs and cfg.updates_per_step == 1 and rollout.sampler_logprobs is None
        old_logp, entropy = (None, None) if on_policy else self.logprobs(self.model, rollout, entropy=True)
        weights, mismatch = sampler_correction(old_logp, rollout, cfg)  # [N, T] or [N, 1], or None
        with timed(seconds, "reference_seconds"), self.policies.reference() as reference:
            ref_logp = None if reference is None else self.logprobs(reference, rollout, entropy=False)  # [N, Tc]
        return Scores(old_logp, entropy, weights, mismatch, ref_logp, seconds)

    def logprobs(self, model: torch.nn.Module, rollout: Rollout, *, entropy: bool) -> Any:
        """Log-probs (and entropy) of all N completions under ``model``, eval mode, no gradient."""
        cfg = self.config
        return score_rollout(model, rollout, temperature=cfg.temperature, chunk=cfg.micro_size, return_entropy=entropy,
                             share_prompts=cfg.share_prompt_cache)

    # ------------------------------------------------------------------ 5. update
    def update(self, rollout: Rollout, scores: Scores, advantages: Advantages, state: Any) -> Updates:
        """Stage 5: mu passes of optimizer updates over shuffled minibatches.

        Each update's gradient is accumulated over micro-batches of
        ``micro_batch_size`` completions, with the loss type's normaliser for the
        whole update (see :mod:`grpo_tutorial.objectives`). With ``scores.old_logp`` None
        (an on-policy step: one update) the old log-probs are the gradient pass's
        own, detached, and the entropy comes from the same pass. ``scores.weights``: a sampler copy's
        importance weights (:mod:`~grpo_tutorial.mismatch`); a sampler's ``sync()`` runs after every update.
        """
        cfg, mask, old_logp = self.config, rollout.completion_mask, scores.old_logp
        out = Updates(lr=float(self.optimizer.param_groups[0]["lr"]))
        if old_logp is None:  # filled by each micro-batch's pass; NaN: a row no pass reached (skipped update)
            out.entropy = torch.full(mask.shape, math.nan, dtype=torch.float32, device=mask.device)  # [N, Tc]
        # mu passes (num_iterations), each cut into shuffled minibatches: one optimizer update per minibatch
        updates = minibatches(len(rollout), cfg.update_size, cfg.num_iterations, cfg.seed, state.step, advantages.values.device)
        was_training = self.model.training
        self.model.train()
        try:
            for rows in updates:  # [M] the completions of one optimizer update
                out.lr = float(self.optimizer.param_groups[0]["lr"])
                self.optimizer.zero_grad(set_to_none=True)
                loss = self.accumulate(rollout, rows, scores, advantages.values, out)
                with timed(out.seconds, "optimizer_seconds"):  # a non-finite loss or norm: no update
                    norm, skipped = finish_update(self.params, self.optimizer, self.scheduler, cfg.max_grad_norm, loss)
                self.sampler.sync()  # a copy follows the policy (the policy itself: nothing to do)
                out.losses.append(loss)
                out.grad_norms.append(norm)
                if skipped is not None:  # history['skipped_updates'] counts it; the warning comes once per run
                    state.skipped_updates += 1
                    state.warn("nonfinite", f"step {state.step + 1}: {skipped}")
        finally:
            self.model.train(was_training)
        return out

    def accumulate(self, rollout: Rollout, rows: torch.Tensor, scores: Scores, advantages: torch.Tensor,
                   out: Updates) -> float:
        """Backward over the micro-batches of one update; return the update's loss.

        Stops at the first non-finite micro-batch loss (the caller then skips
        the update), so no NaN gradient is ever accumulated. When the loss uses
        the entropy (``top_entropy_quantile``, ``entropy_coef``), it is the
        current policy's, from this gradient pass, with its gradient (as TRL).
        """
        cfg, micro, first = self.config, self.config.micro_size, len(out.stats)  # this update's stats start at first
        old_logp, ref_logp = scores.old_logp, scores.ref_logp
        mask = rollout.loss_mask if cfg.mask_tool_tokens else rollout.completion_mask  # the policy's tokens (tools/loop.py)
        options = self.entropy_control.loss_options(cfg.loss_options())  # the loss's settings, this update's coef
        measure = options.needs_entropy or cfg.use_adaptive_entropy  # grpo_loss gets (and sums) the entropies
        with_entropy = old_logp is None or measure  # the scoring pass returns the entropies
        truncated = rollout.truncated.to(mask.device)  # [N]
        normalisers = update_normalisers(options, mask, truncated, rows, micro)  # of the whole update: K, its tokens
        total = 0.0
        for start in range(0, len(rows), micro):
            part = rows[start : start + micro]  # [m]
            with timed(out.seconds, "forward_seconds"):
                logp, entropies = self.policy_logprobs(rollout, part, entropy=with_entropy,
                                                       entropy_grad=options.needs_entropy)  # [m, Tc] x2
                if old_logp is None:
                    out.entropy[part] = entropies.detach().float()
                loss, stats = self.loss(
                    logp, logp.detach() if old_logp is None else old_logp[part], advantages[part], mask[part],
                    options=options, ref_logp=None if ref_logp is None else ref_logp[part], truncated=truncated[part],
                    entropies=entropies if measure else None, **loss_inputs(rollout, scores.weights, part),  # mismatch.py
                    **normalisers,
                )
                out.stats.append(stats)
                value = float(loss.detach())
            total += value
            if not math.isfinite(value):
                return value
            with timed(out.seconds, "backward_seconds"):
                loss.backward()
        self.entropy_control.measured(out.stats[first:])  # adaptive: the update's entropy sets the next coefficient
        return total

    def policy_logprobs(self, rollout: Rollout, rows: torch.Tensor, *, entropy: bool, entropy_grad: bool) -> tuple:
        """The gradient pass: the current policy's log-probs of ``rows`` ``[m, Tc]``, and their entropy (or None)."""
        cfg = self.config
        scored = rollout_logprobs(self.model, rollout, rows, temperature=cfg.temperature, return_entropy=entropy,
                                  entropy_grad=entropy_grad, share_prompts=cfg.share_prompt_cache)
        return scored if entropy else (scored, None)

    def loss(self, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             **inputs: Any) -> tuple[torch.Tensor, dict]:
        """One micro-batch's loss and its statistics: :func:`~grpo_tutorial.loss.grpo_loss`."""
        return grpo_loss(logp, old_logp, advantages, mask, **inputs)


def completion_details(rollout: Rollout, answers: Sequence) -> dict:
    """What the run keeps of each completion beyond its text and rewards (:attr:`GRPOStep.last_details`): plain
    lists, one entry per completion."""
    calls = None if rollout.tool_calls is None else rollout.tool_calls.tolist()
    failures = None if rollout.tool_failures is None else rollout.tool_failures.tolist()
    return {"answers": list(answers), "truncated": rollout.truncated.tolist(),
            "lengths": [int(n) for n in rollout.loss_mask.sum(dim=1).tolist()], "tool_calls": calls,
            "tool_failures": failures}
