"""Chapter 10's tools: loss variants side by side, and a gallery of GRPO bugs.

Two halves.

**Variants.** :func:`token_weights` measures, through autograd and
:func:`~grpo_tutorial.loss.grpo_loss` itself, how much gradient each token of a
batch receives under each ``loss_type``. That is where the ``grpo``, ``dapo``
and ``dr_grpo`` losses differ.

**The bug gallery.** :func:`gallery_step` is one GRPO step written out in a page
of code, the same step as :meth:`GRPOTrainer.train_step
<grpo_tutorial.trainer.GRPOTrainer.train_step>` (a test checks that, with
``bug="none"``, both give the same history row and the same weights). Its
``bug`` argument switches on one **deliberately wrong** variant at a time, each
a mistake that real implementations make.

Why a written-out copy and not the trainer's step with one seam per bug: each
bug lives *between* the stages (which tensor is passed as ``old_logp``, whether
the forward pass runs under ``no_grad``, which mask reaches the loss), and a
reader of chapter 10 should see the wrong line next to the right one on one
page. Seams for these bugs inside ``GRPOTrainer`` would put switches that no
real run wants into the core trainer. So the page stays, and the duplication is
limited to the order of the calls: every stage is the core function itself
(``generate_rollouts``, ``compute_rewards``, ``group_advantages``,
``completion_logprobs``, ``grpo_loss``, ``derive_seed``; :func:`train_with_bug`
visits prompts with ``epoch_permutation``), and the equality test ties the page
to the real step, so a change to the trainer that the page does not follow
fails a test. The
page supports whole-batch updates without warmup only; the trainer's
minibatching, warmup, checkpoints and timing are not repeated here.

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

Every row :func:`gallery_step` returns has the trainer's history keys, plus the
first-pass statistics (``ratio_first_mean``, ``ratio_first_max``,
``clip_frac_first``), ``grad_after_eos`` (how many padding positions after an
EOS received gradient) and ``loss_has_grad_fn``.
"""

from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from grpo_tutorial._checks import one_of, require_tensor
from grpo_tutorial.advantages import group_advantages
from grpo_tutorial.config import GRPOConfig
from grpo_tutorial.logprobs import completion_logprobs
from grpo_tutorial.loss import LOSS_TYPES, grpo_loss
from grpo_tutorial.optim import make_optimizer as build_optimizer
from grpo_tutorial.optim import trainable_parameters
from grpo_tutorial.rewards import answers_match, compute_rewards, extract_answer, reward_function_means
from grpo_tutorial.rollout import Rollout, generate_rollouts
from grpo_tutorial.seeding import derive_seed, epoch_permutation
from grpo_tutorial.tasks import check_rows

__all__ = [
    "BUGS",
    "captured_logs",
    "gallery_step",
    "generate_right_padded",
    "make_optimizer",
    "sequence_level_inputs",
    "token_weights",
    "train_with_bug",
]

#: The values of ``bug`` that :func:`gallery_step` accepts; "none" is the correct step.
BUGS = ("none", "no_grad", "ref_as_old", "sequence_ratio", "no_eos_mask", "old_logp_recomputed")


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


def _check_step_config(config: Any) -> None:
    if not isinstance(config, GRPOConfig):
        raise TypeError(f"config must be a GRPOConfig, got {type(config).__name__}")
    if config.minibatch_size not in (None, config.batch_completions):
        raise ValueError(
            f"config.minibatch_size={config.minibatch_size}: the gallery step updates on the whole batch; "
            "use minibatch_size=None"
        )
    if config.warmup_steps != 0:
        raise ValueError(f"config.warmup_steps={config.warmup_steps}: the gallery step has no warmup; use 0")


def make_optimizer(model: torch.nn.Module, config: GRPOConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters, built exactly as :class:`GRPOTrainer` builds it."""
    if not isinstance(config, GRPOConfig):
        raise TypeError(f"config must be a GRPOConfig, got {type(config).__name__}")
    optimizer, _ = build_optimizer(trainable_parameters(model), config)
    return optimizer


@torch.no_grad()
def _score(model: torch.nn.Module, rollout: Rollout, temperature: float, *, entropy: bool, share: bool) -> Any:
    """Log-probs (and entropy) of every completion, eval mode, no gradient (prompts encoded once if ``share``)."""
    was_training = model.training
    model.eval()
    try:
        return completion_logprobs(
            model,
            rollout.input_ids,
            rollout.attention_mask,
            rollout.completion_ids.shape[1],
            temperature=temperature,
            return_entropy=entropy,
            share_prompts=share,
        )
    finally:
        model.train(was_training)


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


def _accuracy(completions: Sequence[str], answers: Sequence[Any]) -> float:
    if any(a is None for a in answers):
        return math.nan
    return float(np.mean([answers_match(extract_answer(c), a) for c, a in zip(completions, answers)]))


def gallery_step(
    model: torch.nn.Module,
    tokenizer: Any,
    reward_fns: Callable | Sequence[Callable],
    batch: Sequence[dict],
    config: GRPOConfig,
    optimizer: torch.optim.Optimizer,
    *,
    step: int,
    bug: str = "none",
    ref_model: torch.nn.Module | None = None,
) -> dict:
    """One GRPO step on ``batch``, correct (``bug="none"``) or with one bug switched on.

    Same stages, seeds and numbers as ``GRPOTrainer.train_step`` for a trainer
    at step ``step`` (whole-batch updates, no warmup). See the module docstring
    for the bugs.

    Args:
        model: the policy, updated in place.
        tokenizer: its tokenizer.
        reward_fns: reward function(s), TRL signature.
        batch: rows with ``prompt`` and ``answer``.
        config: the run's settings (``minibatch_size=None``, ``warmup_steps=0``).
        optimizer: from :func:`make_optimizer`.
        step: steps already taken (seeds the sampling as the trainer does).
        bug: one of :data:`BUGS`.
        ref_model: a frozen reference policy. Required for ``"ref_as_old"`` and
            for ``beta > 0``; when given, ``kl`` is logged even with ``beta = 0``.

    Returns:
        A history row (see the module docstring for its keys).
    """
    one_of("bug", bug, BUGS)
    _check_step_config(config)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    if (bug == "ref_as_old" or config.beta > 0) and ref_model is None:
        raise ValueError(f"bug={bug!r} with beta={config.beta} needs ref_model (a frozen copy of the start policy)")
    check_rows(batch, "batch")  # the trainer's own check: the same bad batch raises the same error
    cfg, G = config, config.group_size

    # stage 1: rollout, seeded as the trainer seeds it
    rollout = generate_rollouts(
        model, tokenizer, [row["prompt"] for row in batch], group_size=G,
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
        do_sample=True, system_prompt=cfg.system_prompt, use_chat_template=cfg.use_chat_template,
        generator_seed=derive_seed(cfg.seed, 0, step), onednn=cfg.onednn_generation,
    )
    N, Tc = len(rollout), rollout.completion_ids.shape[1]

    # stage 2-3: rewards and group-relative advantages
    answers = [row.get("answer") for row in batch for _ in range(G)]
    rewards, per_fn = compute_rewards(
        reward_fns, cfg.reward_weights, rollout.prompts, rollout.completions, answers
    )  # [N]
    if torch.isnan(rewards).any():
        raise ValueError("a completion got no reward (every function returned None); the gallery step needs one each")
    advantages = group_advantages(rewards, G, scale=cfg.scale_rewards, std=cfg.std)  # [N]
    grouped = rewards.view(-1, G)  # [P, G]

    # stage 4-5: old (and reference) log-probs, no gradient
    real_mask = rollout.completion_mask  # [N, Tc]: 1 up to and including the first EOS
    share = cfg.share_prompt_cache  # each prompt encoded once per pass, as the trainer does
    old_logp, entropy = _score(model, rollout, cfg.temperature, entropy=True, share=share)  # [N, Tc] x2
    ref_logp = None if ref_model is None else _score(ref_model, rollout, cfg.temperature, entropy=False, share=share)
    if bug == "ref_as_old":
        old_logp = ref_logp  # WRONG: the reference did not sample this batch
    loss_mask = torch.ones_like(real_mask) if bug == "no_eos_mask" else real_mask  # WRONG if all ones

    # stage 6: mu passes over the whole batch, in the trainer's shuffled order
    shuffle = torch.Generator().manual_seed(derive_seed(cfg.seed, 2, step))
    params = [p for group in optimizer.param_groups for p in group["params"]]
    max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
    stats: list[dict] = []
    losses: list[float] = []
    norms: list[float] = []
    grad_after_eos = 0
    has_grad_fn = True
    was_training = model.training
    model.train()
    try:
        for _ in range(cfg.num_iterations):
            rows = torch.randperm(N, generator=shuffle)  # [N]
            args = (model, rollout.input_ids[rows], rollout.attention_mask[rows], Tc)
            if bug == "no_grad":
                with torch.no_grad():  # WRONG: the new log-probs need their gradient
                    logp = completion_logprobs(*args, temperature=cfg.temperature, share_prompts=share)  # [N, Tc]
            else:
                logp = completion_logprobs(*args, temperature=cfg.temperature, share_prompts=share)  # [N, Tc]
                logp.retain_grad()  # only to count which positions get gradient
            old = logp.detach() if bug == "old_logp_recomputed" else old_logp[rows]  # WRONG if recomputed
            ref = None if ref_logp is None else ref_logp[rows]
            mask = loss_mask[rows]  # [N, Tc]
            if bug == "sequence_ratio":  # WRONG: one ratio per completion
                ref = None if ref is None else _masked_sum(ref, mask)  # [N, 1]
                new_in, old_in, mask = sequence_level_inputs(logp, old, mask)  # [N, 1] x3
            else:
                new_in, old_in = logp, old
            loss, s = grpo_loss(
                new_in, old_in, advantages[rows], mask, ref_logp=ref, beta=cfg.beta,
                clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps_high, loss_type=cfg.loss_type,
                max_completion_length=cfg.max_new_tokens, kl_kind=cfg.kl_kind,
            )
            stats.append(s)
            losses.append(float(loss.detach()))
            if loss.grad_fn is None:
                has_grad_fn = False
                loss = loss.requires_grad_(True)  # WRONG: the forum "fix" that silences the error
            optimizer.zero_grad(set_to_none=True)
            if not torch.isfinite(loss):
                norms.append(math.nan)
                continue
            loss.backward()
            if logp.grad is not None:
                after_eos = real_mask[rows] == 0  # [N, Tc]
                grad_after_eos += int((logp.grad[after_eos] != 0).sum())
            norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
            norms.append(norm)
            if math.isfinite(norm):
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    finally:
        model.train(was_training)

    lengths = loss_mask.sum(dim=1)  # [N]: what a length metric built from the loss mask reports
    row: dict[str, Any] = {
        "step": step + 1,
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()) if N > 1 else 0.0,
    }
    row.update({f"reward/{name}": value for name, value in reward_function_means(per_fn).items()})
    finite = [s["kl"] for s in stats if not math.isnan(s["kl"])]
    row.update(
        {
            "accuracy": _accuracy(rollout.completions, answers),
            "kl": float(np.mean(finite)) if finite else math.nan,
            "clip_frac_low": float(np.mean([s["clip_frac_low"] for s in stats])),
            "clip_frac_high": float(np.mean([s["clip_frac_high"] for s in stats])),
            "clip_frac": float(np.mean([s["clip_frac"] for s in stats])),
            "ratio_mean": float(np.mean([s["ratio_mean"] for s in stats])),
            "ratio_max": max(s["ratio_max"] for s in stats),
            "entropy": float((entropy * loss_mask).sum() / loss_mask.sum().clamp(min=1.0)),
            "completion_len_mean": float(lengths.mean()),
            "completion_len_max": float(lengths.max()),
            "frac_zero_std": float((grouped == grouped[:, :1]).all(dim=1).float().mean()),
            "frac_truncated": float(rollout.truncated.float().mean()),
            "grad_norm": float(np.mean(norms)),
            "loss": float(np.mean(losses)),
            "ratio_first_mean": stats[0]["ratio_mean"],
            "ratio_first_max": stats[0]["ratio_max"],
            "clip_frac_first": stats[0]["clip_frac"],
            "grad_after_eos": float(grad_after_eos),
            "loss_has_grad_fn": float(has_grad_fn),
        }
    )
    return row


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
    """Run :func:`gallery_step` ``steps`` times; return the history rows.

    Prompts are visited in the trainer's seeded order (``epoch_permutation``),
    so with ``bug="none"`` the run is the one ``GRPOTrainer(model, tokenizer,
    reward_fns, config).train(dataset, steps)`` makes.
    """
    one_of("bug", bug, BUGS)
    _check_step_config(config)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if isinstance(dataset, (str, dict)) or not isinstance(dataset, Sequence) or len(dataset) == 0:
        raise ValueError(f"dataset must be a non-empty list of rows, got {type(dataset).__name__}")
    optimizer = make_optimizer(model, config)
    n, B = len(dataset), config.prompts_per_step
    epoch, index = 0, 0
    perm = epoch_permutation(n, config.seed, epoch)
    history = []
    for step in range(steps):
        batch = []
        while len(batch) < B:
            take = min(B - len(batch), n - index)
            batch.extend(dataset[i] for i in perm[index : index + take])
            index += take
            if index == n:
                epoch, index = epoch + 1, 0
                perm = epoch_permutation(n, config.seed, epoch)
        history.append(
            gallery_step(model, tokenizer, reward_fns, batch, config, optimizer, step=step, bug=bug, ref_model=ref_model)
        )
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
