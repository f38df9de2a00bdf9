"""Our loss options against TRL 1.16's own loss code, on the same tensors (issues 11, 16, 24 and 35).

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
* The default of ``use_bias_correction_kl``: TRL's is True, ours False (see
  :class:`grpo_tutorial.GRPOConfig`). Both settings agree with TRL's.
* LUSPO needs ``importance_sampling_level="sequence"`` and VESPO ``"token"``: ours refuses
  the other level (``LossOptions``), TRL warns and runs.
* Where a reward function gives a whole group one value, our advantages are exactly
  0; TRL's can carry float noise divided by 1e-4 (the tests use rewards that are
  exact in binary, so that the two agree to 1e-6).

A sampler's importance weights (issue 35, ``grpo_loss(sampler_weights=...)``) enter TRL's
``_compute_loss`` as ``inputs["importance_sampling_ratio"]`` when the trainer generates with vLLM
with ``vllm_importance_sampling_correction``; how TRL computes them (inline in
``_generate_and_score_completions``) is checked against its source in ``tests/test_mismatch.py``.

The GDPO advantages (``multi_objective_aggregation``) live in TRL's
``_generate_and_score_completions``, not in ``_compute_loss``; the GDPO tests run
that method on a real tiny ``trl.GRPOTrainer``, with reward functions that return
chosen rewards (``None`` included), and compare the advantages it returns.

TRL applies ``mask_truncated_completions`` outside ``_compute_loss``, when it
builds the batch (it zeroes the truncated rows of ``completion_mask``); the test
checks that this is still what TRL's source does, then feeds ``_compute_loss``
that mask.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections import defaultdict

import pytest
import torch
import trl
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_tutorial import GRPOConfig, GRPOTrainer, make_arithmetic_dataset
from grpo_tutorial.loss import LossOptions, grpo_loss
from grpo_tutorial.mismatch import IS_MODES, sampler_weights
from grpo_tutorial.rewards import partial_credit_reward

from helpers import small_model, tiny_model

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
    trainer._last_world_entropy = float("inf")  # TRL's __init__: no bonus before the first measurement
    trainer._entropy_window_stats = None
    trainer.max_completion_length = args.max_completion_length
    trainer.aux_loss_enabled = False
    trainer.use_vllm = False
    trainer.vllm_importance_sampling_correction = False
    trainer.current_gradient_accumulation_steps = accumulation_steps
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    return trainer


def trl_loss(trainer, logp, old_logp, advantages, mask, *, entropies=None, ref_logp=None, num_items_in_batch=None,
             importance_sampling_ratio=None, sampling_logp=None):
    """TRL's ``_compute_loss`` on these tensors; the model pass returns ``logp`` and ``entropies``.

    ``importance_sampling_ratio``: the vLLM correction's weights (the trainer then believes it generates with
    vLLM, with ``vllm_importance_sampling_correction`` on); ``sampling_logp``: vLLM's own log-probs, which TRL's
    off-policy mask reads when the batch has them."""
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
    if importance_sampling_ratio is not None:
        trainer.use_vllm = trainer.vllm_importance_sampling_correction = True
        inputs["importance_sampling_ratio"] = importance_sampling_ratio
    if sampling_logp is not None:
        inputs["sampling_per_token_logps"] = sampling_logp
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
             with_ref=False, truncated=None, sampler_weights=None):
    """Loss and gradients of TRL and ours on the same tensors; returns both for further checks."""
    logp0, old, adv, mask, ent0, ref = _tensors(seed, spread, shift)
    trainer = _trl_trainer(_trl_args(tmp_path, **trl_kwargs))
    trl_mask = mask if truncated is None else mask * (~truncated)[:, None].to(DTYPE)  # what TRL's batch holds

    logp_a = logp0.clone().requires_grad_(True)
    ent_a = ent0.clone().requires_grad_(True)
    theirs = trl_loss(trainer, logp_a, old, adv, trl_mask, entropies=ent_a, ref_logp=ref if with_ref else None,
                      importance_sampling_ratio=sampler_weights)

    logp_b = logp0.clone().requires_grad_(True)
    ent_b = ent0.clone().requires_grad_(True)
    ours, _ = grpo_loss(
        logp_b, old, adv, mask, ref_logp=ref if with_ref else None,
        entropies=ent_b if with_entropy else None, truncated=truncated, sampler_weights=sampler_weights,
        options=LossOptions(max_completion_length=T, **ours_kwargs),
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


@pytest.mark.parametrize("correction", [False, True])
@pytest.mark.parametrize(
    "loss_type, level",
    [("grpo", "token"), ("grpo", "sequence"), ("dapo", "token"), ("cispo", "token"), ("luspo", "sequence"),
     ("vespo", "token")],
)
def test_kl_penalty_agrees_with_trl_with_and_without_bias_correction(tmp_path, correction, loss_type, level):
    extra_trl = {"epsilon_high": 1.2} if loss_type == "cispo" else {}
    extra_ours = {"clip_eps_high": 0.2} if loss_type == "cispo" else {}
    theirs, ours, g_theirs, g_ours = _compare(
        tmp_path,
        dict(loss_type=loss_type, importance_sampling_level=level, beta=0.04, use_bias_correction_kl=correction,
             **extra_trl),
        dict(loss_type=loss_type, importance_sampling_level=level, beta=0.04, kl_kind="k3",
             use_bias_correction_kl=correction, **extra_ours),
        with_ref=True, spread=0.5,
    )
    _assert_agree(theirs, ours, g_theirs, g_ours)
    other = _compare(
        tmp_path,
        dict(loss_type=loss_type, importance_sampling_level=level, beta=0.04, use_bias_correction_kl=not correction,
             **extra_trl),
        dict(loss_type=loss_type, importance_sampling_level=level, beta=0.04, use_bias_correction_kl=not correction,
             **extra_ours),
        with_ref=True, spread=0.5,
    )
    assert (other[3][0] - g_ours[0]).abs().max().item() > 1e-4  # the setting matters on these tensors


@pytest.mark.parametrize("mode", IS_MODES)
@pytest.mark.parametrize(
    "loss_type, level, extra",
    [("grpo", "token", {}), ("dapo", "sequence", {}), ("cispo", "token", {}), ("sapo", "token", {}),
     ("luspo", "sequence", {}), ("bnpo", "token", dict(beta=0.04, use_bias_correction_kl=True)),
     ("dapo", "token", dict(top_entropy_quantile=0.5)),
     ("grpo", "token", dict(off_policy_mask_threshold=0.05)), ("vespo", "token", {})],
)
def test_the_samplers_importance_weights_enter_the_loss_as_in_trl(tmp_path, mode, loss_type, level, extra):
    """Issue 35: TRL multiplies ``importance_sampling_ratio`` into the per-token loss after the off-policy and
    entropy masks and before the KL term (``_compute_loss``), and VESPO folds it into its sequence weight
    (``get_gamma_weights``); ``grpo_loss(sampler_weights=...)`` does the same."""
    logp0, old, _, mask, _, _ = _tensors(0)
    sampler_logp = old + 0.3 * torch.randn(N, T, generator=torch.Generator().manual_seed(5), dtype=DTYPE)
    weights = sampler_weights(old, sampler_logp, mask, mode, 0.8, 1.25)  # [N, T] or [N, 1]
    assert not torch.all(weights == 1.0)
    trl_extra = {"epsilon_high": 1.2} if loss_type == "cispo" else {}
    ours_extra = {"clip_eps_high": 0.2} if loss_type == "cispo" else {}
    results = _compare(
        tmp_path, dict(loss_type=loss_type, importance_sampling_level=level, **{"beta": 0.0, **extra, **trl_extra}),
        dict(loss_type=loss_type, importance_sampling_level=level, **{**extra, **ours_extra}),
        with_ref="beta" in extra, with_entropy="top_entropy_quantile" in extra, spread=0.5, sampler_weights=weights,
    )
    _assert_agree(*results)
    unweighted = _compare(
        tmp_path, dict(loss_type=loss_type, importance_sampling_level=level, **{"beta": 0.0, **extra, **trl_extra}),
        dict(loss_type=loss_type, importance_sampling_level=level, **{**extra, **ours_extra}),
        with_ref="beta" in extra, with_entropy="top_entropy_quantile" in extra, spread=0.5,
    )
    assert (unweighted[3][0] - results[3][0]).abs().max().item() > 1e-4  # the weights matter on these tensors


@pytest.mark.parametrize("threshold", [0.1, 0.2])
def test_the_off_policy_mask_measures_the_drift_from_the_samplers_logprobs_as_in_trl(tmp_path, threshold):
    """Issue 35: with vLLM's log-probs in the batch, TRL's off-policy mask measures the drift from them (NaN: no
    drift); ``grpo_loss(sampler_logp=...)`` does the same."""
    logp0, old, adv, mask, _, _ = _tensors(0, spread=0.05)  # the trainer has hardly moved ...
    sampler_logp = old + 0.2 + 0.3 * torch.randn(N, T, generator=torch.Generator().manual_seed(7), dtype=DTYPE)
    sampler_logp[1, 0] = sampler_logp[3, 0] = math.nan  # ... but the sampler is far off; some tokens unknown
    trainer = _trl_trainer(_trl_args(tmp_path, loss_type="grpo", beta=0.0, off_policy_mask_threshold=threshold))
    logp_a = logp0.clone().requires_grad_(True)
    theirs = trl_loss(trainer, logp_a, old, adv, mask, sampling_logp=sampler_logp)
    logp_b = logp0.clone().requires_grad_(True)
    ours, _ = grpo_loss(logp_b, old, adv, mask, sampler_logp=sampler_logp,
                        options=LossOptions(max_completion_length=T, off_policy_mask_threshold=threshold))
    _assert_agree(theirs, ours, _grad(theirs, logp_a), _grad(ours, logp_b))
    without, _ = grpo_loss(logp0, old, adv, mask, options=LossOptions(off_policy_mask_threshold=threshold))
    assert abs(without.item() - ours.item()) > 1e-4  # the sampler's drift dropped a sequence the trainer's did not


def test_bias_correction_changes_the_on_policy_gradient_but_not_the_on_policy_loss(tmp_path):
    """On-policy (ratio 1) both KL terms have the same value; the corrected one's gradient differs, as TRL's does."""
    logp0, _, adv, mask, _, ref = _tensors(0)
    for correction in (False, True):
        trainer = _trl_trainer(_trl_args(tmp_path, loss_type="grpo", beta=0.04, use_bias_correction_kl=correction))
        a = logp0.clone().requires_grad_(True)
        theirs = trl_loss(trainer, a, logp0.clone(), adv, mask, ref_logp=ref)
        b = logp0.clone().requires_grad_(True)
        ours, _ = grpo_loss(b, logp0.clone(), adv, mask, ref_logp=ref, beta=0.04, use_bias_correction_kl=correction)
        _assert_agree(theirs, ours, _grad(theirs, a), _grad(ours, b))
    a = logp0.clone().requires_grad_(True)
    plain, plain_stats = grpo_loss(a, logp0.clone(), adv, mask, ref_logp=ref, beta=0.04)
    b = logp0.clone().requires_grad_(True)
    corrected, corrected_stats = grpo_loss(b, logp0.clone(), adv, mask, ref_logp=ref, beta=0.04,
                                           use_bias_correction_kl=True)
    assert corrected.item() == plain.item() and corrected_stats["kl"] == plain_stats["kl"]
    (g_plain,), (g_corrected,) = _grad(plain, a), _grad(corrected, b)
    assert (g_corrected - g_plain).abs().max().item() > 1e-4
    # the difference is beta * (k3 + 1 - ref/pi) - beta * (1 - ref/pi) = beta * k3, spread by grpo's 1 / (N * |o_i|)
    k3 = torch.exp(ref - logp0) - (ref - logp0) - 1
    expected = 0.04 * k3 * mask / (N * mask.sum(dim=1, keepdim=True))
    torch.testing.assert_close(g_corrected - g_plain, expected, atol=1e-12, rtol=1e-9)


# ---------------------------------------------------------------------------
# TRL 1.16's newer options (issue 24): LUSPO, VESPO, adaptive entropy, GDPO
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("options", [{}, {"delta": 1.5}, {"mask_truncated_completions": True},
                                     {"top_entropy_quantile": 0.3}, {"off_policy_mask_threshold": 0.02}])
def test_luspo_agrees_with_trl(tmp_path, options):
    truncated = torch.tensor([False, True, False, False, True, False]) if options.get("mask_truncated_completions") \
        else None
    theirs, ours, g_theirs, g_ours = _compare(
        tmp_path,
        dict(loss_type="luspo", importance_sampling_level="sequence", beta=0.0, **options),
        dict(loss_type="luspo", importance_sampling_level="sequence", **options),
        spread=0.5, shift=0.3, with_entropy="top_entropy_quantile" in options, truncated=truncated,
    )
    _assert_agree(theirs, ours, g_theirs, g_ours)
    assert torch.count_nonzero(g_ours[0]) > 0


def test_luspo_is_gspo_with_each_sequence_scaled_by_its_length():
    """LUSPO's loss is the mean over sequences of |o_i| * GSPO's per-sequence loss, and so is each row's gradient."""
    logp0, old, adv, mask, _, _ = _tensors(1, 0.5, 0.2)
    lengths = mask.sum(dim=1)  # [N]
    a = logp0.clone().requires_grad_(True)
    gspo, _ = grpo_loss(a, old, adv, mask, loss_type="grpo", importance_sampling_level="sequence")
    b = logp0.clone().requires_grad_(True)
    luspo, _ = grpo_loss(b, old, adv, mask, loss_type="luspo", importance_sampling_level="sequence")
    per_sequence = [
        grpo_loss(logp0[i : i + 1], old[i : i + 1], adv[i : i + 1], mask[i : i + 1], loss_type="grpo",
                  importance_sampling_level="sequence")[0]
        for i in range(N)
    ]
    assert luspo.item() == pytest.approx((lengths * torch.stack(per_sequence)).mean().item(), abs=1e-12)
    assert gspo.item() == pytest.approx(torch.stack(per_sequence).mean().item(), abs=1e-12)
    (g_gspo,), (g_luspo,) = _grad(gspo, a), _grad(luspo, b)
    torch.testing.assert_close(g_luspo, lengths[:, None] * g_gspo, atol=1e-12, rtol=1e-10)
    assert lengths.unique().numel() > 1 and torch.count_nonzero(g_gspo) > 0  # the lengths differ: a real test


@pytest.mark.parametrize("shape", [{}, {"vespo_k_pos": 1.0, "vespo_lambda_pos": 0.5, "vespo_k_neg": 4.0,
                                        "vespo_lambda_neg": 3.5}])
@pytest.mark.parametrize("options", [{}, {"mask_truncated_completions": True}, {"top_entropy_quantile": 0.5},
                                     {"entropy_coef": 0.03}])
def test_vespo_agrees_with_trl(tmp_path, shape, options):
    truncated = torch.tensor([True, False, False, False, False, True]) if options.get("mask_truncated_completions") \
        else None
    theirs, ours, g_theirs, g_ours = _compare(
        tmp_path,
        dict(loss_type="vespo", beta=0.0, **shape, **options),
        dict(loss_type="vespo", **shape, **options),
        spread=0.3, with_entropy="top_entropy_quantile" in options or "entropy_coef" in options,
        truncated=truncated,
    )
    _assert_agree(theirs, ours, g_theirs, g_ours)
    assert torch.count_nonzero(g_ours[0]) > 0


def test_vespo_weight_is_detached_and_shaped_as_documented():
    """phi(1) = 1; the peak is at w = k / lambda; no gradient flows through phi; the loss's gradient is
    -phi * A / tokens on each counted token (REINFORCE's form, with phi as a constant)."""
    from grpo_tutorial.objectives import vespo_weights

    ones = torch.zeros(2, 3, dtype=DTYPE)  # log-ratio 0: w = 1
    adv = torch.tensor([[1.0], [-1.0]], dtype=DTYPE)
    full = torch.ones(2, 3, dtype=DTYPE)
    torch.testing.assert_close(vespo_weights(ones, full, adv), torch.ones(2, 1, dtype=DTYPE))
    grid = torch.linspace(-3, 1.5, 4001, dtype=DTYPE)[:, None]  # log w, one token per sequence
    phi = vespo_weights(grid, torch.ones_like(grid), torch.ones_like(grid))  # k=2, lambda=3
    assert torch.exp(grid[phi.argmax()]).item() == pytest.approx(2 / 3, rel=2e-3)

    logp0, old, adv6, mask, _, _ = _tensors(2, 0.3)
    logp = logp0.clone().requires_grad_(True)
    weight = vespo_weights(logp - old, mask, adv6[:, None])
    assert not weight.requires_grad
    loss, _ = grpo_loss(logp, old, adv6, mask, loss_type="vespo")
    (grad,) = _grad(loss, logp)
    torch.testing.assert_close(grad, -weight * adv6[:, None] * mask / mask.sum(), atol=1e-12, rtol=1e-10)
    assert (weight - 1).abs().max() > 0.05  # off-policy tensors: the weights are not all 1


def _adaptive_run(tmp_path, *, target, coef, steps=2, updates=4, quantile=1.0, entropy_scale=3.0, seed=5):
    """``updates`` optimizer updates of ``steps`` micro-batches each, through TRL's _compute_loss (which keeps
    the controller's state) and through ours (grpo_loss + the two controller functions, as the trainer uses
    them). Returns the per-update coefficient trajectories and the largest loss and gradient differences."""
    from grpo_tutorial.objectives import adapt_entropy_coef, applied_entropy_coef

    args = _trl_args(tmp_path, loss_type="dapo", beta=0.0, gradient_accumulation_steps=steps, use_adaptive_entropy=True,
                     entropy_coef=coef, entropy_target=target, entropy_coef_delta=0.05, entropy_coef_min=0.0,
                     entropy_coef_max=0.12, top_entropy_quantile=quantile)
    trainer = _trl_trainer(args, accumulation_steps=steps)
    ours_coef, ours_last = coef, math.inf
    trl_coefs, our_coefs, loss_gap, grad_gap = [], [], 0.0, 0.0
    g = torch.Generator().manual_seed(seed)
    for update in range(updates):
        logp0, old, adv, mask, _, _ = _tensors(update, 0.4)
        ent0 = torch.rand(N, T, generator=g, dtype=DTYPE) * entropy_scale * (0.5 + update / updates)  # [N, T]
        tokens = mask.sum()
        sums = [0.0, 0.0]
        applied = applied_entropy_coef(ours_coef, ours_last, target)
        for i, part in enumerate(torch.arange(N).chunk(steps)):
            trainer.accelerator.sync_gradients = i == steps - 1  # the boundary is the last micro-batch
            a, ea = logp0[part].clone().requires_grad_(True), ent0[part].clone().requires_grad_(True)
            theirs = trl_loss(trainer, a, old[part], adv[part], mask[part], entropies=ea, num_items_in_batch=tokens)
            b, eb = logp0[part].clone().requires_grad_(True), ent0[part].clone().requires_grad_(True)
            ours, stats = grpo_loss(
                b, old[part], adv[part], mask[part], entropies=eb, gradient_accumulation_steps=steps,
                options=LossOptions(loss_type="dapo", entropy_coef=applied, top_entropy_quantile=quantile),
                num_items_in_batch=tokens,
            )
            sums[0] += stats["entropy_sum"]
            sums[1] += stats["entropy_tokens"]
            loss_gap = max(loss_gap, abs(ours.item() - theirs.item()))
            for x, y in zip(_grad(theirs, a, ea), _grad(ours, b, eb)):
                x = torch.zeros_like(b) if x is None else x
                y = torch.zeros_like(b) if y is None else y
                grad_gap = max(grad_gap, (x - y).abs().max().item())
        ours_last = sums[0] / max(sums[1], 1.0)
        ours_coef = adapt_entropy_coef(ours_coef, ours_last, target=target, delta=0.05, coef_min=0.0, coef_max=0.12)
        trl_coefs.append(trainer.entropy_coef)
        our_coefs.append(ours_coef)
        assert trainer._last_world_entropy == pytest.approx(ours_last, abs=1e-12)
    return trl_coefs, our_coefs, loss_gap, grad_gap


@pytest.mark.parametrize("quantile", [1.0, 0.4])
@pytest.mark.parametrize("target, coef", [(1.2, 0.02), (3.0, 0.0), (0.3, 0.1)])
def test_adaptive_entropy_agrees_with_trl_over_several_updates(tmp_path, target, coef, quantile):
    trl_coefs, our_coefs, loss_gap, grad_gap = _adaptive_run(tmp_path, target=target, coef=coef, quantile=quantile)
    assert our_coefs == pytest.approx(trl_coefs, abs=1e-12)
    assert loss_gap < TOL and grad_gap < TOL
    assert len(set(our_coefs)) > 1 or our_coefs[0] in (0.0, 0.12)  # the coefficient moved, or sits at a bound


def test_adaptive_entropy_applies_the_bonus_only_below_the_target():
    from grpo_tutorial.objectives import adapt_entropy_coef, applied_entropy_coef

    assert applied_entropy_coef(0.1, math.inf, 0.5) == 0.0  # before the first measurement
    assert applied_entropy_coef(0.1, 0.5, 0.5) == 0.1 and applied_entropy_coef(0.1, 0.51, 0.5) == 0.0
    assert adapt_entropy_coef(0.1, 0.4, target=0.5, delta=0.03, coef_min=0.0, coef_max=1.0) == pytest.approx(0.13)
    assert adapt_entropy_coef(0.1, 0.6, target=0.5, delta=0.03, coef_min=0.0, coef_max=1.0) == pytest.approx(0.07)
    assert adapt_entropy_coef(0.99, 0.1, target=0.5, delta=0.03, coef_min=0.0, coef_max=1.0) == 1.0
    assert adapt_entropy_coef(0.01, 0.9, target=0.5, delta=0.03, coef_min=0.0, coef_max=1.0) == 0.0


@settings(max_examples=200, deadline=None)
@given(
    coef=st.floats(0.0, 1.0), entropy=st.floats(0.0, 10.0), target=st.floats(0.0, 10.0),
    delta=st.floats(0.0, 0.5), low=st.floats(0.0, 0.5), width=st.floats(0.0, 0.5),
)
def test_adaptive_entropy_coefficient_moves_the_right_way_and_stays_in_bounds(coef, entropy, target, delta, low,
                                                                               width):
    from grpo_tutorial.objectives import adapt_entropy_coef

    high = low + width
    coef = min(max(coef, low), high)  # the controller starts inside its bounds
    new = adapt_entropy_coef(coef, entropy, target=target, delta=delta, coef_min=low, coef_max=high)
    assert low <= new <= high
    if entropy <= target:
        assert new >= coef  # too little entropy: push harder for exploration
    else:
        assert new <= coef


# -- GDPO: TRL's own advantage computation, in _generate_and_score_completions ------------------------------

_G, _P = 4, 3


def _column_reward(column):
    def reward(completions, **kwargs):
        return list(kwargs[column])

    reward.__name__ = f"reward_{column}"
    return reward


def _trl_advantages(tmp_path, per_function, weights, aggregation, scale_rewards="group") -> torch.Tensor:
    """The advantages TRL's _generate_and_score_completions computes for these rewards (None = cannot score)."""
    import datasets


    model, tok = small_model(seed=0)
    k = len(per_function[0])
    columns = [f"r{j}" for j in range(k)]
    rows = [{"prompt": f"{i // _G}+1=", **{c: values[j] for j, c in enumerate(columns)}}
            for i, values in enumerate(per_function)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = trl.GRPOConfig(
            output_dir=str(tmp_path / "trl"), use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True,
            per_device_train_batch_size=len(rows), num_generations=_G, max_completion_length=2, beta=0.0,
            multi_objective_aggregation=aggregation, reward_weights=weights, scale_rewards=scale_rewards,
        )
        trainer = trl.GRPOTrainer(
            model=model, reward_funcs=[_column_reward(c) for c in columns], args=args,
            train_dataset=datasets.Dataset.from_list([{"prompt": r["prompt"], **{c: 0.0 for c in columns}}
                                                      for r in rows]),
            processing_class=tok,
        )
        trainer.model.train()
        out = trainer._generate_and_score_completions(rows)
    return out["advantages"].double()


_REWARDS = [  # [N = 3 groups * 4, K = 2]: a 0/1 correctness and a length-like score on a 10x larger scale
    [1, 10], [0, 30], [1, 20], [0, 0],
    [1, 5], [1, 5], [1, 6], [1, 5],  # the first function is silent here
    [0.5, 0], [None, 0], [0, 0], [1, None],  # unscorable entries
]


def _as_matrix(per_function) -> torch.Tensor:
    return torch.tensor([[math.nan if v is None else float(v) for v in row] for row in per_function])


def _our_stage_2(per_function, weights):
    """The package's stage 2 on the same reward functions: (weighted total [N], per-function rewards [N, K])."""
    from grpo_tutorial.rewards import compute_rewards

    k = len(per_function[0])
    columns = {f"r{j}": [row[j] for row in per_function] for j in range(k)}
    n = len(per_function)
    total, per_fn = compute_rewards(
        [_column_reward(c) for c in columns], weights, ["p"] * n, ["c"] * n, [None] * n, **columns
    )
    return total, torch.stack(list(per_fn.values()), dim=1)


@pytest.mark.parametrize("weights", [[1.0, 1.0], [1.0, 0.25]])
def test_normalize_then_sum_agrees_with_trl(tmp_path, weights):
    from grpo_tutorial.advantages import normalize_then_sum

    theirs = _trl_advantages(tmp_path, _REWARDS, weights, "normalize_then_sum")
    _, per_function = _our_stage_2(_REWARDS, weights)
    ours = normalize_then_sum(per_function, _G, weights).double()
    torch.testing.assert_close(ours, theirs, atol=TOL, rtol=TOL)
    assert ours.abs().max() > 0.5


@pytest.mark.parametrize("weights", [[1.0, 1.0], [1.0, 0.25]])
def test_sum_then_normalize_agrees_with_trl(tmp_path, weights):
    """The default path: the weighted sum (None counts as 0 unless every function is None), then group z-scores."""
    from grpo_tutorial.advantages import group_advantages

    theirs = _trl_advantages(tmp_path, _REWARDS, weights, "sum_then_normalize")
    total, _ = _our_stage_2(_REWARDS, weights)
    ours = group_advantages(total, _G, nan="skip").double()
    torch.testing.assert_close(ours, theirs, atol=TOL, rtol=TOL)
    gdpo = _trl_advantages(tmp_path, _REWARDS, weights, "normalize_then_sum")
    assert (gdpo - theirs).abs().max() > 0.1  # the two aggregations differ on these rewards


def test_normalize_then_sum_keeps_a_small_scale_reward_that_summing_drowns():
    """Scaling one reward function by 100 changes GRPO's advantages but not GDPO's."""
    from grpo_tutorial.advantages import group_advantages, normalize_then_sum

    base = _as_matrix(_REWARDS[:4] * 2)  # two groups, all scorable
    scaled = base * torch.tensor([100.0, 1.0])  # the 0/1 reward now outweighs the 0-30 one
    # exactly scale-free without the eps guard (eps = 1e-4 shifts each z-score by ~eps / std)
    torch.testing.assert_close(normalize_then_sum(scaled, _G, eps=0.0), normalize_then_sum(base, _G, eps=0.0))
    torch.testing.assert_close(normalize_then_sum(scaled, _G), normalize_then_sum(base, _G), atol=1e-3, rtol=0)
    grpo_base = group_advantages(base.sum(dim=1), _G)
    grpo_scaled = group_advantages(scaled.sum(dim=1), _G)
    assert (grpo_base - grpo_scaled).abs().max() > 0.1
    # with one function, GDPO is GRPO's group z-scores, z-scored once more over the batch
    one = base[:, :1]
    z = group_advantages(one.view(-1), _G)
    expected = (z - z.mean()) / (z.std() + 1e-4)
    torch.testing.assert_close(normalize_then_sum(one, _G), expected, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------------------
# gradient accumulation: TRL's normalisers (issue 16)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"])
@pytest.mark.parametrize("steps", [2, 3])
def test_accumulated_micro_batches_agree_with_trl(tmp_path, loss_type, steps):
    """K micro-batches of one update: TRL's _compute_loss with gradient_accumulation_steps = K and
    num_items_in_batch = the update's tokens, against ours with the same two normalisers."""
    logp0, old, adv, mask, _, _ = _tensors(3, 0.5)
    level = "sequence" if loss_type == "luspo" else "token"
    extra = {"epsilon_high": 1.2} if loss_type == "cispo" else {}
    args = _trl_args(tmp_path, loss_type=loss_type, beta=0.0, gradient_accumulation_steps=steps,
                     importance_sampling_level=level, **extra)
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
            gradient_accumulation_steps=steps, num_items_in_batch=tokens, importance_sampling_level=level, **clip,
        )
        assert ours.item() == pytest.approx(theirs.item(), abs=TOL)
        theirs.backward()
        ours.backward()
    torch.testing.assert_close(b.grad, a.grad, atol=TOL, rtol=TOL)


# ---------------------------------------------------------------------------
# the trainer: one update, split into 1, 2 or 4 micro-batches (issue 16)
# ---------------------------------------------------------------------------


def _update_gradient(loss_type: str, micro_batch_size: int | None, **options) -> tuple[list[torch.Tensor], dict]:
    model, tok = tiny_model(seed=4)
    cfg = GRPOConfig(
        prompts_per_step=2, group_size=4, seed=9, max_new_tokens=5, loss_type=loss_type,
        micro_batch_size=micro_batch_size, max_grad_norm=None, **options,
    )
    trainer = GRPOTrainer(model, tok, partial_credit_reward, cfg)
    grads: list[torch.Tensor] = []
    real = trainer.optimizer.step

    def record(*args, **kwargs):
        grads.extend(p.grad.detach().clone() for p in trainer.grpo_step.params)
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
        ("luspo", {"importance_sampling_level": "sequence"}),
        ("vespo", {}),
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
