"""Chapter 10's tools: loss variants side by side, and a gallery of GRPO bugs.

Two halves.

**Variants.** :func:`token_weights` measures, through autograd and
:func:`~grpo_tutorial.loss.grpo_loss` itself, how much gradient each token of a
batch receives under each ``loss_type``. That is where the ``grpo``, ``dapo``
and ``dr_grpo`` losses differ.

**The bug gallery.** :func:`gallery_step` is the trainer's own step,
:class:`~grpo_tutorial.step.GRPOStep` (what :meth:`GRPOTrainer.train_step
<grpo_tutorial.trainer.GRPOTrainer.train_step>` runs; a test checks that, with
``bug="none"``, both give the same history row and the same weights). Its
``bug`` argument plants one **deliberately wrong** variant at a time, each a
mistake that real implementations make, as a subclass of the step that
overrides the one stage the bug breaks (:data:`GALLERY_BUGS`): stage 4's old
log-probs (``ref_as_old``, ``old_logp_recomputed``), stage 5's gradient pass or
loss (``no_grad``, ``sequence_ratio``, ``no_eos_mask``). The correct step is the trainer's by construction, and each
bug is a few lines beside the stage it replaces, the wrong line next to the call
of the right one. :class:`GalleryStep`, the base of them all, changes no number:
it keeps what the gallery's row adds (:data:`EXTRA_KEYS`).

The gallery keeps the trainer's settings except a few (:data:`GALLERY_REFUSES`,
each refused with an error that names the field): minibatches and
micro-batches, the entropy options, dynamic sampling, GDPO's aggregation,
reference syncing, logged completions, LoRA, and a sampler that is not the
learner with its correction. Every other field of
:class:`~grpo_tutorial.config.GRPOConfig` either acts as in the trainer
(:data:`GALLERY_IMPLEMENTS`; tests compare the two for each) or only concerns the
loop around a step (:data:`GALLERY_IGNORES`: logging, checkpoints, evaluation).

The bugs:

``"no_grad"``
    WRONG: the new log-probs are computed under ``torch.no_grad()``. The loss
    then has no ``grad_fn`` and ``backward()`` raises; the step applies the
    "fix" often seen in forums, ``loss.requires_grad_(True)``, after which
    ``backward()`` runs and every gradient is None: nothing trains.
``"ref_as_old"``
    WRONG: the reference model's log-probs are used as ``old_logp``. The ratio
    becomes pi_theta / pi_ref, the drift since training began, so it is not 1
    on the first pass and clipping holds the policy near the reference.
``"sequence_ratio"``
    WRONG: log-probs are summed over each completion before the ratio, so the
    ratio is a product of token ratios and leaves the clip range quickly.
``"no_eos_mask"``
    WRONG: the loss mask is all ones, so the padding after each EOS is trained
    on, and lengths measured from the mask read the full width for every row.
``"old_logp_recomputed"``
    WRONG: ``old_logp`` is recomputed from the current weights at every inner
    pass (``logp.detach()``), so the ratio is always 1 and clipping never acts.

Padding the prompts on the wrong side is a bug of generation, not of the step:
:func:`generate_right_padded` (also WRONG on purpose) shows it, and
:func:`captured_logs` catches the warning ``transformers`` prints about it.

Every row :func:`gallery_step` returns is the trainer's history row
(:func:`~grpo_tutorial.metrics.history_row`; with ``no_eos_mask`` its lengths and
entropy read the all-ones mask), plus :data:`EXTRA_KEYS`: the first update's
statistics (``ratio_first_mean``, ``ratio_first_max``, ``clip_frac_first``),
``grad_after_eos`` (how many padding positions after an EOS received gradient) and
``loss_has_grad_fn``. The gallery issues none of the trainer's failure-mode warnings.
"""

from __future__ import annotations

import dataclasses
import logging
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch

from grpo_tutorial._checks import one_of, require_tensor
from grpo_tutorial.config import GRPOConfig
from grpo_tutorial.loss import LOSS_TYPES, grpo_loss
from grpo_tutorial.models import Policies, disable_dropout
from grpo_tutorial.run.state import RunState
from grpo_tutorial.seeding import next_batch
from grpo_tutorial.stage_results import Rewards, Scores, Updates
from grpo_tutorial.step import GRPOStep

__all__ = [
    "BUGS",
    "EXTRA_KEYS",
    "GALLERY_BUGS",
    "GALLERY_IGNORES",
    "GALLERY_IMPLEMENTS",
    "GALLERY_REFUSES",
    "captured_logs",
    "gallery_step",
    "generate_right_padded",
    "sequence_level_inputs",
    "token_weights",
    "train_with_bug",
]

#: The values of ``bug`` that :func:`gallery_step` accepts; "none" is the correct step.
BUGS = ("none", "no_grad", "ref_as_old", "sequence_ratio", "no_eos_mask", "old_logp_recomputed")
#: What the gallery's row adds to the trainer's history row.
EXTRA_KEYS = ("ratio_first_mean", "ratio_first_max", "clip_frac_first", "grad_after_eos", "loss_has_grad_fn")


# ---------------------------------------------------------------------------
# Variants: how much gradient each token gets
# ---------------------------------------------------------------------------


def token_weights(
    lengths: Sequence[int] | torch.Tensor,
    loss_type: str,
    *,
    max_completion_length: int | None = None,
) -> torch.Tensor:
    """The weight w_i with which every token of completion i enters the loss's gradient.

    At ratio 1 (the first inner pass) and with no KL term, the derivative of
    ``grpo_loss`` with respect to the log-prob of any counted token of
    completion i is ``-A_i * w_i``. This function measures ``w_i`` by autograd,
    through the package's own ``grpo_loss``, for a batch whose completions have
    the given lengths (every advantage set to 1, so the clip never acts).

    The formulas it reproduces: ``grpo`` gives ``1 / (N * len_i)``, ``dapo``
    and ``bnpo`` ``1 / sum_j len_j``, ``dr_grpo`` ``1 / (N * max_completion_length)``.

    Args:
        lengths: ``[N]`` counted tokens of each completion (ints >= 1).
        loss_type: one of ``"grpo"``, ``"bnpo"``, ``"dapo"``, ``"dr_grpo"``.
        max_completion_length: the ``dr_grpo`` constant (default: the longest length).

    Returns:
        ``[N]`` float64 weights.
    """
    one_of("loss_type", loss_type, LOSS_TYPES)
    lens = torch.as_tensor(lengths)
    if lens.dim() != 1 or lens.numel() == 0 or lens.is_floating_point() or lens.dtype == torch.bool:
        raise ValueError(f"lengths must be a non-empty 1-D list of ints, got {lengths!r}")
    if int(lens.min()) < 1:
        raise ValueError(f"lengths must all be >= 1 (every completion has at least its EOS), got {lens.tolist()}")
    width = int(lens.max())
    if max_completion_length is not None and (
        isinstance(max_completion_length, bool) or not isinstance(max_completion_length, int) or max_completion_length < width
    ):
        raise ValueError(
            f"max_completion_length must be an int >= the longest length {width}, got {max_completion_length!r}"
        )
    mask = (torch.arange(width)[None, :] < lens[:, None]).double()  # [N, T]
    old = torch.zeros(len(lens), width, dtype=torch.float64)  # [N, T]
    logp = old.clone().requires_grad_(True)  # [N, T], ratio exactly 1
    ones = torch.ones(len(lens), dtype=torch.float64)  # [N], A = 1 for everyone
    loss, _ = grpo_loss(logp, old, ones, mask, loss_type=loss_type, max_completion_length=max_completion_length)
    (grad,) = torch.autograd.grad(loss, logp)  # [N, T]
    return -grad[:, 0]  # [N]: the same for every counted token of a row


# ---------------------------------------------------------------------------
# The gallery step
# ---------------------------------------------------------------------------


#: GRPOConfig fields the gallery step does not implement: it refuses any value but the one given here.
GALLERY_REFUSES: dict[str, str] = {
    "minibatch_size": "None (the gallery step makes one update per pass over the whole batch)",
    "micro_batch_size": "None (the gallery step scores the whole batch in one pass)",
    "top_entropy_quantile": "1.0 (the entropy options need the gradient pass's entropies; use GRPOTrainer)",
    "entropy_coef": "0.0 (the entropy options need the gradient pass's entropies; use GRPOTrainer)",
    "use_adaptive_entropy": "False (adaptive entropy control lives in GRPOTrainer)",
    "dynamic_sampling": "False (resampling draws from the data stream; use GRPOTrainer)",
    "multi_objective_aggregation": "'sum_then_normalize' (GDPO's per-function advantages live in GRPOTrainer)",
    "ref_sync_every": "None (the gallery's reference stays the model it was given)",
    "log_completions": "False (the gallery shows no completions while it trains)",
    "use_peft": "False (the gallery trains every weight; LoRA adapters live in GRPOTrainer)",
    "sampler": "'policy' (the gallery samples with the policy itself; sampler copies live in GRPOTrainer)",
    "vllm_importance_sampling_correction": "False (the correction needs a sampler copy's log-probs; use GRPOTrainer)",
}
#: Fields that change nothing in one step: they drive the loop, the files and the evaluation around it.
GALLERY_IGNORES = frozenset({
    "log_every", "num_completions_to_print", "completions_to_keep", "report_to", "checkpoint_every", "checkpoint_in_place", "output_dir",
    "eval_batch_size",
    "max_sampling_rounds", "entropy_target", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta",
    # only with tools (GRPOTrainer(tools=...)), which the gallery's step is never given
    "max_tool_calling_iterations", "tool_time_limit", "tool_rollout_time_limit", "mask_tool_tokens",
    # only with use_peft, which the gallery refuses
    "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "merge_adapters_for_sampling",
    # only with a sampler copy or the correction, which the gallery refuses
    "sampler_staleness", "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_min",
    "vllm_importance_sampling_clip_max",
})
#: Fields the gallery step uses as the trainer does (tests/test_pitfalls.py checks each against the trainer).
GALLERY_IMPLEMENTS = frozenset(
    {f.name for f in dataclasses.fields(GRPOConfig)} - set(GALLERY_REFUSES) - GALLERY_IGNORES
)


def _check_step_config(config: Any) -> None:
    """Refuse a config the gallery step would not follow, naming the field."""
    if not isinstance(config, GRPOConfig):
        raise TypeError(f"config must be a GRPOConfig, got {type(config).__name__}")
    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    for name, expected in GALLERY_REFUSES.items():
        value = getattr(config, name)
        if name == "minibatch_size" and value == config.batch_completions:
            continue  # one minibatch of all B*G completions is the whole batch
        if name == "micro_batch_size" and value == config.update_size:
            continue
        if value != defaults[name]:
            raise ValueError(f"config.{name}={value!r}: the bug gallery's step needs {name}={expected}")


def _masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum over each row's counted positions: [N, T] -> [N, 1]."""
    return torch.where(mask.bool(), values, torch.zeros_like(values)).sum(dim=1, keepdim=True)


def sequence_level_inputs(
    logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """WRONG on purpose: whole-completion log-probs, to feed ``grpo_loss`` one ratio per sequence.

    Returns ``(seq_logp, seq_old_logp, ones)``, each ``[N, 1]``: the masked sums
    of the per-token log-probs and a mask of ones. ``grpo_loss`` then computes
    ``exp(seq_logp - seq_old_logp)``, which is the *product* of the token
    ratios of the completion, and clips that. Positions where ``mask`` is 0 are
    left out (even if they hold inf or NaN).
    """
    require_tensor("logp", logp, dim=2, floating=True)
    require_tensor("old_logp", old_logp, dim=2, floating=True)
    require_tensor("mask", mask, dim=2)
    if logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(
            f"logp, old_logp and mask must have one shape [N, T], got {tuple(logp.shape)}, "
            f"{tuple(old_logp.shape)} and {tuple(mask.shape)}"
        )
    ones = torch.ones(logp.shape[0], 1, dtype=logp.dtype, device=logp.device)  # [N, 1]
    return _masked_sum(logp, mask), _masked_sum(old_logp, mask), ones


class GalleryStep(GRPOStep):
    """The trainer's step (:class:`~grpo_tutorial.step.GRPOStep`), instrumented for the gallery's row.

    It changes no number of the step: it refuses a completion no reward function
    scored (stage 2), and keeps the gradient of the update's log-probs and its first
    update's statistics (stage 5), for the row's :data:`EXTRA_KEYS`. Each bug of
    :data:`BUGS` is a subclass that overrides the one stage it breaks
    (:data:`GALLERY_BUGS`).
    """

    def __init__(self, model, tokenizer, reward_fns, config: GRPOConfig, ref_model=None) -> None:
        super().__init__(model, tokenizer, reward_fns, config, policies=Policies(model, ref_model))
        #: Stage 4 scores the old log-probs even when the step is on-policy (mu = 1), as the trainer does with this
        #: switch off: two bugs replace them, and a bug invisible at step 1 must leave step 1's numbers as they are.
        self.reuse_on_policy_logprobs = False
        self.passes: list[tuple[torch.Tensor, torch.Tensor]] = []  # (log-probs [m, Tc], their rows) of the update
        self.grad_fn = True  # every micro-batch's loss had a grad_fn

    def reward(self, batch, rollout, state) -> Rewards:
        rewards = super().reward(batch, rollout, state)
        if torch.isnan(rewards.rewards).any():
            raise ValueError("a completion got no reward (every function returned None); the gallery step needs one each")
        return rewards

    def policy_logprobs(self, rollout, rows, *, entropy, entropy_grad) -> tuple:
        logp, entropies = super().policy_logprobs(rollout, rows, entropy=entropy, entropy_grad=entropy_grad)
        if logp.requires_grad:
            logp.retain_grad()  # only to count which positions get gradient
        self.passes.append((logp, rows))
        return logp, entropies

    def update(self, rollout, scores, advantages, state) -> Updates:
        self.passes, self.grad_fn = [], True
        out = super().update(rollout, scores, advantages, state)
        after_eos = rollout.completion_mask == 0  # [N, Tc]: after the first EOS
        first = out.stats[0]
        out.row.update({
            "ratio_first_mean": first["ratio_mean"],
            "ratio_first_max": first["ratio_max"],
            "clip_frac_first": first["clip_frac"],
            "grad_after_eos": float(sum(int((logp.grad[after_eos[rows]] != 0).sum())
                                        for logp, rows in self.passes if logp.grad is not None)),
            "loss_has_grad_fn": float(self.grad_fn),
        })  # the row's EXTRA_KEYS
        return out


class NoGrad(GalleryStep):
    """Stage 5 broken: the gradient pass runs under ``no_grad``, and the loss is "fixed" to need a gradient."""

    def policy_logprobs(self, rollout, rows, *, entropy, entropy_grad) -> tuple:
        with torch.no_grad():  # WRONG: the new log-probs need their gradient
            return super().policy_logprobs(rollout, rows, entropy=entropy, entropy_grad=entropy_grad)

    def loss(self, logp, old_logp, advantages, mask, **inputs) -> tuple:
        loss, stats = super().loss(logp, old_logp, advantages, mask, **inputs)
        if loss.grad_fn is None:
            self.grad_fn = False
            loss = loss.requires_grad_(True)  # WRONG: the forum "fix" that silences backward()'s error
        return loss, stats


class RefAsOld(GalleryStep):
    """Stage 4 broken: the reference's log-probs stand in for the sampling policy's."""

    def score(self, rollout) -> Scores:
        scores = super().score(rollout)
        return dataclasses.replace(scores, old_logp=scores.ref_logp)  # WRONG: the reference did not sample this batch


class SequenceRatio(GalleryStep):
    """Stage 5 broken: the loss gets one log-prob per completion (their sum), so one ratio per sequence."""

    def loss(self, logp, old_logp, advantages, mask, **inputs) -> tuple:
        ref = inputs.get("ref_logp")
        inputs["ref_logp"] = None if ref is None else _masked_sum(ref, mask)  # [m, 1]
        inputs.pop("num_items_in_batch", None)  # the token count: here the mask of ones counts the completions
        new, old, ones = sequence_level_inputs(logp, old_logp, mask)  # WRONG: [m, 1] x3
        return super().loss(new, old, advantages, ones, **inputs)


class NoEosMask(GalleryStep):
    """Stage 5 broken: the loss's mask is all ones, so the padding after each EOS is trained on; the history row
    measures lengths and entropy with the same mask."""

    def loss(self, logp, old_logp, advantages, mask, **inputs) -> tuple:
        inputs.pop("num_items_in_batch", None)  # the tokens the loss counts: those of its own mask
        return super().loss(logp, old_logp, advantages, torch.ones_like(mask), **inputs)  # WRONG: padding counts

    def update(self, rollout, scores, advantages, state) -> Updates:
        out = super().update(rollout, scores, advantages, state)
        rollout.completion_mask = torch.ones_like(rollout.completion_mask)  # WRONG, for the row: the same mask
        return out


class OldLogpRecomputed(GalleryStep):
    """Stage 4 broken: no old log-probs are kept, so every pass of the update takes its own (ratio 1 throughout)."""

    def score(self, rollout) -> Scores:
        scores = super().score(rollout)
        return dataclasses.replace(scores, old_logp=None)  # WRONG: the update recomputes them from the current weights at every pass


#: Each bug of :data:`BUGS`: the step that plants it, an override of the one stage it breaks.
GALLERY_BUGS: dict[str, type[GalleryStep]] = {
    "none": GalleryStep, "no_grad": NoGrad, "ref_as_old": RefAsOld, "sequence_ratio": SequenceRatio,
    "no_eos_mask": NoEosMask, "old_logp_recomputed": OldLogpRecomputed,
}


def _gallery(model, tokenizer, reward_fns, config: GRPOConfig, bug: str, ref_model) -> GalleryStep:
    """The checked arguments' step: the trainer's, with ``bug`` planted."""
    one_of("bug", bug, BUGS)
    _check_step_config(config)
    if (bug == "ref_as_old" or config.beta > 0) and ref_model is None:
        raise ValueError(f"bug={bug!r} with beta={config.beta} needs ref_model (a frozen copy of the start policy)")
    if config.disable_dropout and ref_model is not None:  # as the trainer does with its own reference
        disable_dropout(ref_model)
    return GALLERY_BUGS[bug](model, tokenizer, reward_fns, config, ref_model)


def _quiet(kind: str, message: str) -> None:
    """The gallery's runs' ``warn``: it shows its rows; the failure-mode warnings its bugs would trip stay quiet."""


def _state(step: int) -> RunState:
    """Where the gallery's run stands: the trainer's own :class:`~grpo_tutorial.run.state.RunState`, kept quiet."""
    return RunState(step=step, warn=_quiet)


def gallery_step(
    model: torch.nn.Module,
    tokenizer: Any,
    reward_fns: Callable | Sequence[Callable],
    batch: Sequence[dict],
    config: GRPOConfig,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    *,
    step: int,
    bug: str = "none",
    ref_model: torch.nn.Module | None = None,
) -> dict:
    """One GRPO step on ``batch``, correct (``bug="none"``) or with one bug switched on.

    The step is the trainer's, :class:`~grpo_tutorial.step.GRPOStep`, for a trainer
    at step ``step`` (the settings it refuses are in :data:`GALLERY_REFUSES`), with
    ``bug`` planted as an override of the one stage it breaks (:data:`GALLERY_BUGS`;
    the module docstring describes them).

    Args:
        model: the policy, updated in place.
        tokenizer: its tokenizer.
        reward_fns: reward function(s), TRL signature.
        batch: rows with ``prompt`` and ``answer`` (other columns reach the reward functions).
        config: the run's settings.
        optimizer, scheduler: from :func:`grpo_tutorial.optim.make_optimizer`, as the trainer builds them.
        step: steps already taken (seeds the sampling and the shuffles as the trainer does).
        bug: one of :data:`BUGS`.
        ref_model: a frozen reference policy. Required for ``"ref_as_old"`` and
            for ``beta > 0``; when given, ``kl`` is logged even with ``beta = 0``.

    Returns:
        A history row (see the module docstring for its keys).
    """
    one_of("bug", bug, BUGS)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    grpo = _gallery(model, tokenizer, reward_fns, config, bug, ref_model)
    grpo.optimizer, grpo.scheduler = optimizer, scheduler
    return grpo(batch, _state(step), [])  # the trainer's row, with the gallery's EXTRA_KEYS


def train_with_bug(
    model: torch.nn.Module,
    tokenizer: Any,
    reward_fns: Callable | Sequence[Callable],
    dataset: Sequence[dict],
    config: GRPOConfig,
    steps: int,
    *,
    bug: str = "none",
    ref_model: torch.nn.Module | None = None,
) -> list[dict]:
    """Run the gallery's step ``steps`` times; return the history rows.

    Batches come from the trainer's data stream (``next_batch``) and the step
    builds its optimizer as the trainer's does, so with ``bug="none"`` the run is
    the one ``GRPOTrainer(model, tokenizer, reward_fns, config).train(dataset, steps)``
    makes.
    """
    one_of("bug", bug, BUGS)
    _check_step_config(config)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if isinstance(dataset, (str, dict)) or not isinstance(dataset, Sequence) or len(dataset) == 0:
        raise ValueError(f"dataset must be a non-empty list of rows, got {type(dataset).__name__}")
    grpo = _gallery(model, tokenizer, reward_fns, config, bug, ref_model)
    state, epoch, index = _state(0), 0, 0
    history = []
    for _ in range(steps):
        batch, epoch, index = next_batch(dataset, config.prompts_per_step, config.seed, epoch, index)
        history.append(grpo(batch, state, []))
    return history


# ---------------------------------------------------------------------------
# Padding on the wrong side
# ---------------------------------------------------------------------------


@torch.no_grad()
def generate_right_padded(
    model: torch.nn.Module, tokenizer: Any, prompts: Sequence[str], *, max_new_tokens: int
) -> list[str]:
    """WRONG on purpose: greedy completions of prompts padded on the RIGHT.

    ``generate`` appends new tokens after the last column. With right padding a
    short prompt is followed by pad tokens there, so the model continues from
    ``"3+5=<pad><pad>"`` instead of ``"3+5="``. The attention mask hides the pad
    tokens from the other positions, but the first new token is predicted *at* a
    pad position. Compare with ``generate_rollouts(..., do_sample=False)``,
    which pads on the left.

    Returns the decoded completions, one per prompt (special tokens removed).
    """
    if isinstance(prompts, str) or not isinstance(prompts, Sequence) or not prompts:
        raise TypeError(f"prompts must be a non-empty list of strings, got {prompts!r:.80}")
    if not all(isinstance(p, str) for p in prompts):
        raise TypeError("prompts must be a list of strings")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True, padding_side="right")  # WRONG side
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        out = model.generate(
            input_ids=enc.input_ids.to(device), attention_mask=enc.attention_mask.to(device),
            max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        )
    finally:
        model.train(was_training)
    completion_ids = out[:, enc.input_ids.shape[1] :]  # [B, Tc]
    return tokenizer.batch_decode(completion_ids, skip_special_tokens=True)


@contextmanager
def captured_logs(name: str = "transformers", level: int = logging.WARNING) -> Iterator[list[str]]:
    """Collect the messages a library logs (``transformers`` warns through ``logging``).

    Inside the block, records of ``level`` or above from logger ``name`` (and its
    children) are appended to the yielded list instead of being printed.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a logger name such as 'transformers', got {name!r}")
    messages: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger = logging.getLogger(name)
    handler = _Collect(level)
    saved = (logger.handlers[:], logger.propagate)
    logger.handlers = [handler]
    logger.propagate = False
    try:
        yield messages
    finally:
        logger.handlers, logger.propagate = saved
