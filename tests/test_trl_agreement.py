"""Our loss options against TRL 1.16's own loss code, on the same tensors (issues 11 and 16).

TRL computes the loss in ``GRPOTrainer._compute_loss``. We run that very method:
a ``trl.GRPOTrainer`` made with ``__new__`` (no model, no dataset) gets the
attributes ``_compute_loss`` reads, set from a real ``trl.GRPOConfig`` the way
TRL's ``__init__`` sets them, and its ``_get_per_token_logps_and_entropies`` returns
our tensors (with gradient) instead of running a model. For each option, our
``grpo_loss`` must give the same loss and the same gradient (w.r.t. the
log-probs, and the entropies where they matter) to 1e-6.

Deliberate differences are pinned here and explained in the docstrings:

* CISPO's cap: ours is ``1 + clip_eps_high``, TRL's is ``epsilon_high``
  (:func:`grpo_tutorial.objectives.cispo_objective`).
* The KL term: TRL 1.16 multiplies it by the ratio (``use_bias_correction_kl=True``);
  ours is the plain k3 estimate (:func:`grpo_tutorial.kl.kl_estimate`). Equal with
  ``use_bias_correction_kl=False``.

TRL applies ``mask_truncated_completions`` outside ``_compute_loss``, when it
builds the batch (it zeroes the truncated rows of ``completion_mask``); the test
checks that this is still what TRL's source does, then feeds ``_compute_loss``
that mask.
"""

from __future__ import annotations

import inspect
import warnings
from collections import defaultdict

import pytest
import torch
import trl

from grpo_tutorial import GRPOConfig, GRPOTrainer, build_tiny_policy, make_arithmetic_dataset
from grpo_tutorial.loss import grpo_loss
from grpo_tutorial.rewards import partial_credit_reward

TOL = 1e-6
N, T = 6, 5
DTYPE = torch.float64


class _OneProcess:
    """The collective operations of ``accelerate.Accelerator`` that ``_compute_loss`` calls, for one process."""

    num_processes = 1
    sync_gradients = True

    def pad_across_processes(self, tensor, dim=0, pad_index=0):
        return tensor

    def gather(self, tensor):
        return tensor

    def gather_for_metrics(self, tensor):
        return tensor

    def reduce(self, tensor, reduction="sum"):
        return tensor


def _trl_args(tmp_path, **overrides) -> trl.GRPOConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trl.GRPOConfig(
            output_dir=str(tmp_path), use_cpu=True, report_to="none", max_completion_length=T, **overrides
        )


def _trl_trainer(args: trl.GRPOConfig, accumulation_steps: int = 1) -> trl.GRPOTrainer:
    """A ``trl.GRPOTrainer`` holding only what ``_compute_loss`` reads, set as TRL's ``__init__`` sets it."""
    trainer = trl.GRPOTrainer.__new__(trl.GRPOTrainer)
    trainer.args = args
    trainer.accelerator = _OneProcess()
    trainer.model = torch.nn.Linear(1, 1)  # only its .training flag is read: "train" mode
    trainer.loss_type = args.loss_type
    trainer.beta = args.beta
    trainer.epsilon_low = args.epsilon
    trainer.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    trainer.importance_sampling_level = args.importance_sampling_level
    trainer.off_policy_mask_threshold = args.off_policy_mask_threshold
    trainer.mask_truncated_completions = args.mask_truncated_completions
    trainer.top_entropy_quantile = args.top_entropy_quantile
    trainer.entropy_coef = args.entropy_coef
    trainer.use_adaptive_entropy = args.use_adaptive_entropy
    trainer._entropy_bonus_enabled = trainer.entropy_coef != 0.0 or trainer.use_adaptive_entropy
    trainer.max_completion_length = args.max_completion_length
    trainer.aux_loss_enabled = False
    trainer.use_vllm = False
    trainer.vllm_importance_sampling_correction = False
    trainer.current_gradient_accumulation_steps = accumulation_steps
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    return trainer


def trl_loss(trainer, logp, old_logp, advantages, mask, *, entropies=None, ref_logp=None, num_items_in_batch=None):
    """TRL's ``_compute_loss`` on these tensors; the model pass returns ``logp`` and ``entropies``."""
    n, t = logp.shape
    ent = torch.zeros_like(logp) if entropies is None else entropies
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logp, ent, None)
    inputs = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long),
        "prompt_mask": torch.ones(n, 1, dtype=torch.long),
        "completion_ids": torch.zeros(n, t, dtype=torch.long),
        "completion_mask": mask.long(),
        "advantages": advantages,
        "old_per_token_logps": old_logp,
        "num_items_in_batch": torch.as_tensor(mask.sum() if num_items_in_batch is None else num_items_in_batch),
    }
    if ref_logp is not None:
        inputs["ref_per_token_logps"] = ref_logp
    return trainer._compute_loss(None, inputs)


def _tensors(seed: int = 0, spread: float = 0.4, shift: float = 0.0):
    """Log-probs with ratios well outside the clip range, ragged lengths, mixed-sign advantages.

    ``shift`` moves every log-ratio up (ratios above 1, where ``delta`` bites).
    """
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(N, T, generator=g, dtype=DTYPE) * 2 - 0.1  # [N, T]
    logp = old + shift + spread * torch.randn(N, T, generator=g, dtype=DTYPE)  # [N, T]
    lengths = torch.tensor([5, 2, 4, 1, 3, 5])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(DTYPE)  # [N, T]
    adv = torch.tensor([1.3, -0.7, 0.4, -1.1, 0.0, -0.2], dtype=DTYPE)  # [N]
    entropies = torch.rand(N, T, generator=g, dtype=DTYPE) * 3  # [N, T]
    ref = old + 0.3 * torch.randn(N, T, generator=g, dtype=DTYPE)  # [N, T]
    return logp, old, adv, mask, entropies, ref


def _grad(loss, *leaves):
    return torch.autograd.grad(loss, leaves, allow_unused=True)


def _compare(tmp_path, trl_kwargs: dict, ours_kwargs: dict, *, seed=0, spread=0.4, shift=0.0, with_entropy=False,
             with_ref=False, truncated=None):
    """Loss and gradients of TRL and ours on the same tensors; returns both for further checks."""
    logp0, old, adv, mask, ent0, ref = _tensors(seed, spread, shift)
    trainer = _trl_trainer(_trl_args(tmp_path, **trl_kwargs))
    trl_mask = mask if truncated is None else mask * (~truncated)[:, None].to(DTYPE)  # what TRL's batch holds

    logp_a = logp0.clone().requires_grad_(True)
    ent_a = ent0.clone().requires_grad_(True)
    theirs = trl_loss(trainer, logp_a, old, adv, trl_mask, entropies=ent_a, ref_logp=ref if with_ref else None)

    logp_b = logp0.clone().requires_grad_(True)
    ent_b = ent0.clone().requires_grad_(True)
    ours, _ = grpo_loss(
        logp_b, old, adv, mask, ref_logp=ref if with_ref else None,
        entropies=ent_b if with_entropy else None, truncated=truncated, max_completion_length=T, **ours_kwargs,
    )
    g_theirs = _grad(theirs, logp_a, ent_a)
    g_ours = _grad(ours, logp_b, ent_b)
    return theirs, ours, g_theirs, g_ours


def _assert_agree(theirs, ours, g_theirs, g_ours):
    assert ours.item() == pytest.approx(theirs.item(), abs=TOL, rel=TOL)
    for a, b in zip(g_theirs, g_ours):
        if a is None or b is None:  # no gradient path on one side means none on the other
            assert (a is None or torch.count_nonzero(a) == 0) and (b is None or torch.count_nonzero(b) == 0)
        else:
            torch.testing.assert_close(b, a, atol=TOL, rtol=TOL)


# ---------------------------------------------------------------------------
# one option at a time
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo", "sapo"])
def test_loss_types_and_importance_sampling_level_agree_with_trl(tmp_path, loss_type, level):
    results = _compare(
        tmp_path,
        dict(loss_type=loss_type, importance_sampling_level=level, epsilon=0.2, epsilon_high=0.28, beta=0.0),
        dict(loss_type=loss_type, importance_sampling_level=level, clip_eps=0.2, clip_eps_high=0.28),
    )
    _assert_agree(*results)
    assert torch.count_nonzero(results[3][0]) > 0  # a real gradient was compared


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_delta_agrees_with_trl(tmp_path, loss_type, level):
    results = _compare(
        tmp_path,
        dict(loss_type=loss_type, importance_sampling_level=level, delta=1.5, beta=0.0),
        dict(loss_type=loss_type, importance_sampling_level=level, delta=1.5),
        spread=0.5, shift=0.6,
    )
    _assert_agree(*results)
    without = grpo_loss(*_tensors(0, 0.5, 0.6)[:4], loss_type=loss_type, importance_sampling_level=level)[0]
    assert abs(without.item() - results[1].item()) > 1e-3  # the cap did bite on these ratios


@pytest.mark.parametrize("temperatures", [(1.0, 1.05), (0.5, 2.0)])
def test_sapo_temperatures_agree_with_trl(tmp_path, temperatures):
    pos, neg = temperatures
    _assert_agree(*_compare(
        tmp_path,
        dict(loss_type="sapo", sapo_temperature_pos=pos, sapo_temperature_neg=neg, beta=0.0),
        dict(loss_type="sapo", sapo_temperature_pos=pos, sapo_temperature_neg=neg),
        spread=1.0,
    ))


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_cispo_agrees_with_trl_once_the_cap_is_translated(tmp_path, level):
    """TRL's cap is epsilon_high itself; ours is 1 + clip_eps_high (one meaning of clip_eps_high)."""
    _assert_agree(*_compare(
        tmp_path,
        dict(loss_type="cispo", epsilon_high=1.25, importance_sampling_level=level, beta=0.0),
        dict(loss_type="cispo", clip_eps_high=0.25, importance_sampling_level=level),
        spread=1.0,
    ))


def test_cispo_cap_differs_from_trl_by_design(tmp_path):
    """The pinned difference: the same number means 1 + eps for us and the cap itself for TRL."""
    theirs, ours, g_theirs, g_ours = _compare(
        tmp_path,
        dict(loss_type="cispo", epsilon_high=0.25, beta=0.0),
        dict(loss_type="cispo", clip_eps_high=0.25),
        spread=1.0,
    )
    assert abs(ours.item() - theirs.item()) > 1e-2
    # TRL's weight can never exceed 0.25: every counted token's gradient is at most 0.25 * |A| * (1/tokens)
    logp, old, adv, mask, _, _ = _tensors(0, 1.0)
    bound = 0.25 * adv.abs()[:, None] / mask.sum()
    assert bool((g_theirs[0].abs() <= bound + 1e-12).all())
    assert bool((g_ours[0].abs() > bound + 1e-6).any())


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "cispo"])
def test_mask_truncated_completions_agrees_with_trl(tmp_path, loss_type):
    source = inspect.getsource(trl.GRPOTrainer._generate_and_score_completions)
    assert "completion_mask = completion_mask * (~is_truncated).unsqueeze(1).int()" in source
    truncated = torch.tensor([True, False, False, True, False, False])
    extra = {"epsilon_high": 1.2} if loss_type == "cispo" else {}
    theirs, ours, g_theirs, g_ours = _compare(
        tmp_path,
        dict(loss_type=loss_type, mask_truncated_completions=True, beta=0.0, **extra),
        dict(loss_type=loss_type, mask_truncated_completions=True),
        truncated=truncated,
    )
    _assert_agree(theirs, ours, g_theirs, g_ours)
    assert torch.count_nonzero(g_ours[0][truncated]) == 0 and torch.count_nonzero(g_ours[0][~truncated]) > 0


@pytest.mark.parametrize("quantile", [0.0, 0.2, 0.5])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_top_entropy_quantile_agrees_with_trl(tmp_path, quantile, loss_type):
    _assert_agree(*_compare(
        tmp_path,
        dict(loss_type=loss_type, top_entropy_quantile=quantile, beta=0.0),
        dict(loss_type=loss_type, top_entropy_quantile=quantile),
        with_entropy=True,
    ))


@pytest.mark.parametrize("quantile", [1.0, 0.3])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "sapo"])
def test_entropy_coef_agrees_with_trl(tmp_path, quantile, loss_type):
    theirs, ours, g_theirs, g_ours = _compare(
        tmp_path,
        dict(loss_type=loss_type, entropy_coef=0.05, top_entropy_quantile=quantile, beta=0.0),
        dict(loss_type=loss_type, entropy_coef=0.05, top_entropy_quantile=quantile),
        with_entropy=True,
    )
    _assert_agree(theirs, ours, g_theirs, g_ours)
    assert torch.count_nonzero(g_ours[1]) > 0  # the bonus has a gradient through the entropies


@pytest.mark.parametrize("threshold", [0.0, 0.05])
def test_off_policy_mask_agrees_with_trl(tmp_path, threshold):
    theirs, ours, g_theirs, g_ours = _compare(
        tmp_path,
        dict(loss_type="grpo", off_policy_mask_threshold=threshold, beta=0.0),
        dict(loss_type="grpo", off_policy_mask_threshold=threshold),
        spread=0.6,
    )
    _assert_agree(theirs, ours, g_theirs, g_ours)
    plain = _compare(tmp_path, dict(loss_type="grpo", beta=0.0), dict(loss_type="grpo"), spread=0.6)
    assert abs(plain[1].item() - ours.item()) > 1e-4  # some negative-advantage sequence was dropped


def test_kl_penalty_agrees_with_trl_without_its_bias_correction(tmp_path):
    _assert_agree(*_compare(
        tmp_path,
        dict(loss_type="grpo", beta=0.04, use_bias_correction_kl=False),
        dict(loss_type="grpo", beta=0.04, kl_kind="k3"),
        with_ref=True,
    ))


def test_kl_penalty_differs_from_trl_bias_correction_by_design(tmp_path):
    """TRL 1.16 weights the KL by the ratio (DeepSeek-V3.2); ours keeps the plain k3 penalty (chapter 5).

    On-policy (ratio 1) the values agree but the gradients do not: the ratio's
    own gradient adds KL * grad(log pi) to each token.
    """
    logp0, _, adv, mask, _, ref = _tensors(0)
    trainer = _trl_trainer(_trl_args(tmp_path, loss_type="grpo", beta=0.04, use_bias_correction_kl=True))
    a = logp0.clone().requires_grad_(True)
    theirs = trl_loss(trainer, a, logp0.clone(), adv, mask, ref_logp=ref)
    b = logp0.clone().requires_grad_(True)
    ours, _ = grpo_loss(b, logp0.clone(), adv, mask, ref_logp=ref, beta=0.04)
    assert ours.item() == pytest.approx(theirs.item(), abs=TOL)
    (ga,), (gb,) = _grad(theirs, a), _grad(ours, b)
    assert (ga - gb).abs().max().item() > 1e-4


# ---------------------------------------------------------------------------
# gradient accumulation: TRL's normalisers (issue 16)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"])
@pytest.mark.parametrize("steps", [2, 3])
def test_accumulated_micro_batches_agree_with_trl(tmp_path, loss_type, steps):
    """K micro-batches of one update: TRL's _compute_loss with gradient_accumulation_steps = K and
    num_items_in_batch = the update's tokens, against ours with the same two normalisers."""
    logp0, old, adv, mask, _, _ = _tensors(3, 0.5)
    extra = {"epsilon_high": 1.2} if loss_type == "cispo" else {}
    args = _trl_args(tmp_path, loss_type=loss_type, beta=0.0, gradient_accumulation_steps=steps, **extra)
    assert args.steps_per_generation == steps  # one generation batch per optimizer update
    trainer = _trl_trainer(args, accumulation_steps=steps)
    tokens = mask.sum()
    a = logp0.clone().requires_grad_(True)
    b = logp0.clone().requires_grad_(True)
    clip = {"clip_eps_high": 0.2} if loss_type == "cispo" else {}
    for part in torch.arange(N).chunk(steps):
        theirs = trl_loss(trainer, a[part], old[part], adv[part], mask[part], num_items_in_batch=tokens)
        ours, _ = grpo_loss(
            b[part], old[part], adv[part], mask[part], loss_type=loss_type, max_completion_length=T,
            gradient_accumulation_steps=steps, num_items_in_batch=tokens, **clip,
        )
        assert ours.item() == pytest.approx(theirs.item(), abs=TOL)
        theirs.backward()
        ours.backward()
    torch.testing.assert_close(b.grad, a.grad, atol=TOL, rtol=TOL)


# ---------------------------------------------------------------------------
# the trainer: one update, split into 1, 2 or 4 micro-batches (issue 16)
# ---------------------------------------------------------------------------


def _update_gradient(loss_type: str, micro_batch_size: int | None, **options) -> tuple[list[torch.Tensor], dict]:
    model, tok = build_tiny_policy(seed=4)
    cfg = GRPOConfig(
        prompts_per_step=2, group_size=4, seed=9, max_new_tokens=5, loss_type=loss_type,
        micro_batch_size=micro_batch_size, max_grad_norm=None, **options,
    )
    trainer = GRPOTrainer(model, tok, partial_credit_reward, cfg)
    grads: list[torch.Tensor] = []
    real = trainer.optimizer.step

    def record(*args, **kwargs):
        grads.extend(p.grad.detach().clone() for p in trainer._params)
        return real(*args, **kwargs)

    trainer.optimizer.step = record
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = trainer.train_step(make_arithmetic_dataset(8, seed=2, digits=1)[:2])
    return grads, row


@pytest.mark.parametrize(
    "loss_type, options",
    [
        ("grpo", {}),
        ("dr_grpo", {}),
        ("dapo", {}),
        ("bnpo", {}),
        ("dapo", {"mask_truncated_completions": True}),
        ("dapo", {"importance_sampling_level": "sequence"}),
        ("cispo", {}),
        ("sapo", {}),
    ],
)
def test_micro_batches_give_the_whole_update_gradient(loss_type, options):
    whole, row = _update_gradient(loss_type, None, **options)
    assert whole and max(g.abs().max().item() for g in whole) > 1e-4  # a real gradient
    if options.get("mask_truncated_completions"):
        assert 0 < row["frac_truncated"] < 1  # precondition: some completions are masked, not all
    for micro in (4, 2):
        split, _ = _update_gradient(loss_type, micro, **options)
        gap = max((a - b).abs().max().item() for a, b in zip(whole, split))
        if loss_type == "bnpo":  # each micro-batch divides by its own tokens, as TRL's bnpo does
            assert gap > 1e-6, f"bnpo with micro-batches of {micro} should differ from one batch"
        else:
            assert gap < TOL, f"{loss_type} {options}: micro-batches of {micro} change the gradient by {gap}"
