"""Each variant option on an exact small example, and an invariant that breaks if the option does (issue 11).

TRL agreement is in tests/test_trl_agreement.py; here each option is checked
against numbers worked out by hand and against the property that defines it.
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import grpo_tutorial.step as step_module
from grpo_tutorial import GRPOConfig, GRPOTrainer, make_arithmetic_dataset
from grpo_tutorial.advantages import group_advantages
from grpo_tutorial.metrics import TIMING_KEYS
from grpo_tutorial.loss import NAMED_OPTIONS, LossOptions, grpo_loss
from grpo_tutorial.objectives import (
    clipped_surrogate,
    high_entropy_mask,
    importance_weights,
    masked_log_ratio,
    off_policy_mask,
)
from grpo_tutorial.rewards import partial_credit_reward
from grpo_tutorial.seeding import next_batch
from helpers import tiny_model

D = torch.float64


def _grad(loss, x):
    (g,) = torch.autograd.grad(loss, x)
    return g


# ---------------------------------------------------------------------------
# delta: two-sided clipping
# ---------------------------------------------------------------------------


def test_delta_caps_the_ratio_term_on_an_exact_example():
    ratio = torch.tensor([[3.0, 0.5, 1.1]], dtype=D)
    adv = torch.tensor([[-1.0]], dtype=D)
    plain = clipped_surrogate(ratio, adv, 0.2, 0.2)
    capped = clipped_surrogate(ratio, adv, 0.2, 0.2, delta=2.0)
    # A < 0: -min(rho*A, clip(rho)*A) = max(rho, clip(rho)) * |A|; delta caps rho itself at 2
    assert plain.tolist() == [[3.0, 0.8, 1.1]]
    assert capped.tolist() == [[2.0, 0.8, 1.1]]


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10_000), st.floats(1.3, 3.0))
def test_with_delta_the_ratio_term_never_exceeds_delta(seed, delta):
    g = torch.Generator().manual_seed(seed)
    logp = (torch.randn(4, 6, generator=g, dtype=D) * 2).requires_grad_(True)
    old = torch.zeros(4, 6, dtype=D)
    adv = torch.randn(4, generator=g, dtype=D)
    loss, _ = grpo_loss(logp, old, adv, torch.ones(4, 6, dtype=D), options=LossOptions(delta=delta, loss_type="dapo"))
    # every token's loss is at most delta * |A|, and its gradient at most delta * |A| / tokens
    ratio = torch.exp(logp.detach())
    per_token = clipped_surrogate(ratio, adv[:, None], 0.2, 0.2, delta)
    assert bool((per_token <= delta * adv.abs()[:, None] + 1e-12).all())
    bound = delta * adv.abs()[:, None] / 24
    assert bool((_grad(loss, logp).abs() <= bound + 1e-12).all())


# ---------------------------------------------------------------------------
# GSPO: one ratio per sequence
# ---------------------------------------------------------------------------


def test_sequence_ratio_is_the_geometric_mean_of_the_token_ratios():
    logp = torch.tensor([[0.2, 0.4, 9.0], [-0.3, 0.0, 0.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=D)
    w = importance_weights(masked_log_ratio(logp, torch.zeros_like(logp), mask), mask, "sequence")
    torch.testing.assert_close(w[0, :2], torch.full((2,), math.exp(0.3), dtype=D))
    torch.testing.assert_close(w[1, :1], torch.full((1,), math.exp(-0.3), dtype=D))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000))
def test_with_gspo_every_token_of_a_sequence_shares_one_ratio(seed):
    g = torch.Generator().manual_seed(seed)
    logp, old = torch.randn(5, 7, generator=g, dtype=D), torch.randn(5, 7, generator=g, dtype=D)
    lengths = torch.randint(1, 8, (5,), generator=g)
    mask = (torch.arange(7)[None, :] < lengths[:, None]).to(D)
    w = importance_weights(masked_log_ratio(logp, old, mask), mask, "sequence")  # [5, 7]
    for i in range(5):
        kept = w[i, : lengths[i]]
        assert torch.equal(kept, kept[:1].expand_as(kept))
    token = importance_weights(masked_log_ratio(logp, old, mask), mask, "token")
    assert not torch.equal(w, token)  # the token level really is per token


# ---------------------------------------------------------------------------
# CISPO and SAPO
# ---------------------------------------------------------------------------


def test_cispo_keeps_the_gradient_of_clipped_tokens():
    # token 0: ratio 2 > 1 + 0.2 with A > 0: PPO's clip gives no gradient, CISPO -1.2 * A / tokens;
    # token 1: ratio e^0.05 inside the range: the detached weight times A / tokens (no d weight / d logp term)
    logp = torch.tensor([[math.log(2.0), -1.0]], dtype=D, requires_grad=True)
    old = torch.tensor([[0.0, -1.05]], dtype=D)
    adv, mask = torch.tensor([1.0], dtype=D), torch.ones(1, 2, dtype=D)
    clip_grad = _grad(grpo_loss(logp, old, adv, mask, loss_type="dapo")[0], logp)
    cispo_grad = _grad(grpo_loss(logp, old, adv, mask, loss_type="cispo")[0], logp)
    assert clip_grad[0, 0].item() == 0.0
    torch.testing.assert_close(cispo_grad, torch.tensor([[-1.2 / 2, -math.exp(0.05) / 2]], dtype=D))


def test_sapo_at_ratio_one_has_the_plain_gradient_and_a_smooth_gate():
    logp = torch.zeros(2, 3, dtype=D, requires_grad=True)
    adv, mask = torch.tensor([1.0, -0.5], dtype=D), torch.ones(2, 3, dtype=D)
    loss, _ = grpo_loss(logp, logp.detach(), adv, mask, options=LossOptions(loss_type="sapo", sapo_temperature_pos=1.0,
                        sapo_temperature_neg=2.0))
    # value at rho = 1: -(4 / tau) * sigmoid(0) * A, per sequence
    assert loss.item() == pytest.approx((-(4 / 1.0) * 0.5 * 1.0 - (4 / 2.0) * 0.5 * -0.5) / 2)
    plain, _ = grpo_loss(logp, logp.detach(), adv, mask, loss_type="grpo")
    torch.testing.assert_close(_grad(loss, logp), _grad(plain, logp))
    # far off-policy the gate fades but never cuts to exactly 0
    far = torch.full((2, 3), 1.5, dtype=D, requires_grad=True)
    g = _grad(grpo_loss(far, torch.zeros(2, 3, dtype=D), adv, mask, loss_type="sapo")[0], far)
    assert bool((g != 0).all())


# ---------------------------------------------------------------------------
# the masks: truncated completions, high-entropy tokens, off-policy sequences
# ---------------------------------------------------------------------------


def test_masked_truncated_completions_get_zero_loss_and_gradient():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], dtype=D, requires_grad=True)
    old = logp.detach() - 0.1
    adv, mask = torch.tensor([1.0, -1.0], dtype=D), torch.ones(2, 2, dtype=D)
    truncated = torch.tensor([True, False])
    loss, _ = grpo_loss(logp, old, adv, mask, options=LossOptions(loss_type="dapo", mask_truncated_completions=True), truncated=truncated)
    grad = _grad(loss, logp)
    assert torch.count_nonzero(grad[0]) == 0 and torch.count_nonzero(grad[1]) == 2
    # dapo divides by the 2 counted tokens, not 4: row 1 alone, ratio e^0.1 < 1.2, A = -1
    assert loss.item() == pytest.approx(math.exp(0.1))
    # every completion truncated: loss 0, gradient 0, no error
    all_cut = grpo_loss(logp, old, adv, mask, options=LossOptions(mask_truncated_completions=True), truncated=torch.tensor([True, True]))[0]
    assert all_cut.item() == 0.0 and torch.count_nonzero(_grad(all_cut, logp)) == 0


def test_top_entropy_quantile_keeps_exactly_the_top_fraction():
    entropies = torch.arange(10, dtype=D).reshape(2, 5) / 10  # 10 distinct values
    mask = torch.ones(2, 5, dtype=D)
    kept = high_entropy_mask(entropies, mask, 0.2)
    assert kept.sum().item() == 2 and kept[1, 3:].all()  # the two highest: 0.8 and 0.9
    assert high_entropy_mask(entropies, mask, 1.0).all()
    assert high_entropy_mask(entropies, mask, 0.0).sum().item() == 1  # only the highest
    # padded tokens never count, however high their entropy
    mask[1, 4] = 0.0
    kept = high_entropy_mask(entropies, mask, 0.2)
    assert not kept[1, 4] and kept.sum().item() == 2


def test_top_entropy_quantile_trains_only_the_kept_tokens():
    logp = torch.zeros(2, 5, dtype=D, requires_grad=True)
    entropies = torch.arange(10, dtype=D).reshape(2, 5) / 10
    loss, _ = grpo_loss(logp, logp.detach(), torch.tensor([1.0, 1.0], dtype=D), torch.ones(2, 5, dtype=D),
                        options=LossOptions(top_entropy_quantile=0.2), entropies=entropies)
    assert (_grad(loss, logp) != 0).tolist() == [[False] * 5, [False, False, False, True, True]]


def test_entropy_coef_adds_minus_coef_times_the_mean_entropy():
    g = torch.Generator().manual_seed(1)
    logp = torch.randn(3, 4, generator=g, dtype=D)
    old, adv = logp - 0.05, torch.tensor([1.0, -1.0, 0.5], dtype=D)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=D)
    entropies = torch.rand(3, 4, generator=g, dtype=D).requires_grad_(True)
    base, _ = grpo_loss(logp, old, adv, mask)
    bonus, _ = grpo_loss(logp, old, adv, mask, options=LossOptions(entropy_coef=0.1), entropies=entropies)
    mean_entropy = (entropies * mask).sum() / mask.sum()
    assert (bonus - base).item() == pytest.approx(-0.1 * mean_entropy.item())
    torch.testing.assert_close(_grad(bonus, entropies), -0.1 * mask / mask.sum())


def test_off_policy_mask_drops_only_negative_advantage_sequences_that_moved():
    old = torch.zeros(3, 2, dtype=D)
    logp = torch.tensor([[-0.5, -0.5], [-0.5, -0.5], [-0.01, -0.01]], dtype=D)  # KL 0.5, 0.5, 0.01
    adv = torch.tensor([[1.0], [-1.0], [-1.0]], dtype=D)
    keep = off_policy_mask(adv, logp, old, torch.ones(3, 2, dtype=D), threshold=0.1)
    assert keep.flatten().tolist() == [1.0, 0.0, 1.0]
    # on-policy the estimate is 0: nothing is ever dropped
    assert off_policy_mask(adv, old, old, torch.ones(3, 2, dtype=D), threshold=0.0).all()


# ---------------------------------------------------------------------------
# advantages: RLOO and REINFORCE++
# ---------------------------------------------------------------------------


def test_rloo_on_an_exact_example():
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 3.0, 3.0, 3.0]]), baseline="rloo", scale="none")
    torch.testing.assert_close(adv, torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3], [0.0, 0.0, 0.0, 0.0]]))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 6), st.sampled_from(["group", "batch", "none"]))
def test_rloo_is_the_leave_one_out_formula_and_sums_to_zero(seed, G, scale):
    r = torch.rand(3, G, generator=torch.Generator().manual_seed(seed), dtype=D)
    adv = group_advantages(r, baseline="rloo", scale=scale)
    loo = torch.stack([r[:, i] - (r.sum(dim=1) - r[:, i]) / (G - 1) for i in range(G)], dim=1)
    divisor = {"group": r.std(dim=1, keepdim=True) + 1e-4, "batch": r.std() + 1e-4, "none": 1.0}[scale]
    torch.testing.assert_close(adv, loo / divisor)
    torch.testing.assert_close(adv.sum(dim=1), torch.zeros(3, dtype=D), atol=1e-9, rtol=0)


def test_rloo_skips_unscorable_completions():
    adv = group_advantages(torch.tensor([[1.0, float("nan"), 0.0, 0.0]]), baseline="rloo", scale="none", nan="skip")
    torch.testing.assert_close(adv, torch.tensor([[1.0, 0.0, -0.5, -0.5]]))


def test_reinforce_plus_plus_uses_one_batch_baseline():
    r = torch.tensor([[1.0, 1.0], [0.0, 2.0]])
    adv = group_advantages(r, baseline="batch", scale="batch")
    expected = (r - 1.0) / (r.std() + 1e-4)
    torch.testing.assert_close(adv, expected)
    assert adv[0].tolist() == [0.0, 0.0]  # here the batch mean happens to equal the group's
    r2 = torch.tensor([[2.0, 2.0], [0.0, 2.0]])  # an all-equal group above the batch mean still learns
    assert (group_advantages(r2, baseline="batch", scale="none")[0] > 0).all()
    with pytest.raises(ValueError, match="scale='batch'"):
        group_advantages(r, baseline="batch", scale="group")


def test_batch_baseline_skips_unscorable_completions():
    r = torch.tensor([[1.0, float("nan")], [0.0, 2.0]])
    adv = group_advantages(r, baseline="batch", scale="none", nan="skip")
    torch.testing.assert_close(adv, torch.tensor([[0.0, 0.0], [-1.0, 1.0]]))  # batch mean of 1, 0, 2 is 1
    scaled = group_advantages(r, baseline="batch", scale="batch", nan="skip")
    torch.testing.assert_close(scaled, adv / (torch.tensor([1.0, 0.0, 2.0]).std() + 1e-4))


# ---------------------------------------------------------------------------
# config validation
# ---------------------------------------------------------------------------


#: Options of the loss: one validator (LossOptions), reached from the config and from grpo_loss's keywords.
LOSS_OPTION_CASES = [
    (dict(delta=1.1), "delta must be None or a number > 1 + clip_eps_high = 1.2, got 1.1"),
    (dict(delta=2.0, loss_type="cispo"), "delta must be None with loss_type='cispo', got 2.0"),
    (dict(delta=2.0, loss_type="sapo"), "delta must be None with loss_type='sapo', got 2.0"),
    (dict(importance_sampling_level="seq"), "importance_sampling_level must be one of ['token', 'sequence']"),
    (dict(sapo_temperature_neg=0.0), "sapo_temperature_neg must be a number > 0, got 0.0"),
    (dict(loss_type="sapo", sapo_temperature_pos=0.0), "sapo_temperature_pos must be a number > 0, got 0.0"),
    (dict(top_entropy_quantile=1.5), "top_entropy_quantile must be a number in [0, 1]"),
    (dict(off_policy_mask_threshold=-1.0), "off_policy_mask_threshold must be None or a number >= 0"),
    (dict(clip_eps=1.5), "clip_eps must be a number in (0, 1), e.g. 0.2, got 1.5"),
    (dict(beta=-0.1), "beta must be a number >= 0 (0 = no KL penalty), got -0.1"),
    (dict(kl_kind="k4"), "kl_kind must be one of ['k1', 'k2', 'k3'], got 'k4'"),
    (dict(loss_type="luspo"), "importance_sampling_level must be 'sequence' with loss_type='luspo', got 'token'"),
    (dict(loss_type="vespo", importance_sampling_level="sequence"),
     "importance_sampling_level must be 'token' with loss_type='vespo', got 'sequence'"),
    (dict(loss_type="vespo", delta=2.0), "delta must be None with loss_type='vespo', got 2.0"),
    (dict(loss_type="vespo", vespo_k_neg=-1.0), "vespo_k_neg must be a number >= 0"),
    (dict(loss_type="vespo", vespo_lambda_pos=0.0), "vespo_lambda_pos must be a number > 0"),
]


def loss_arguments(settings: dict) -> dict:
    """grpo_loss's arguments for these settings: the named ones as keywords, any other in options."""
    if set(settings) <= set(NAMED_OPTIONS):
        return dict(settings)
    return {"options": LossOptions(**settings)}


@pytest.mark.parametrize("kwargs, message", LOSS_OPTION_CASES)
def test_the_config_and_grpo_loss_refuse_a_bad_loss_option_with_one_message(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(f"GRPOConfig.{message}")):
        GRPOConfig(**kwargs)
    with pytest.raises(ValueError, match=re.escape(f"LossOptions.{message}")):
        grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3), **loss_arguments(kwargs))
    with pytest.raises(ValueError, match=re.escape(f"LossOptions.{message}")):
        LossOptions(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(advantage_baseline="mean"), "advantage_baseline must be one of"),
        (dict(advantage_baseline="batch"), "scale_rewards must be 'batch' or 'none'"),
        (dict(max_sampling_rounds=0), "max_sampling_rounds must be an int >= 1"),
        (dict(clip_eps_high=4.0), "clip_eps_high must be None or a number in (0, 1)"),
        (dict(multi_objective_aggregation="sum"), "multi_objective_aggregation must be one of"),
        (dict(multi_objective_aggregation="normalize_then_sum", scale_rewards="batch"),
         "scale_rewards must be 'group' with multi_objective_aggregation='normalize_then_sum', got 'batch'"),
        (dict(multi_objective_aggregation="normalize_then_sum", advantage_baseline="rloo"),
         "advantage_baseline must be 'group' with multi_objective_aggregation='normalize_then_sum'"),
        (dict(use_adaptive_entropy=True, entropy_coef=0.5, entropy_coef_max=0.1),
         "entropy_coef must be in [entropy_coef_min, entropy_coef_max] = [0, 0.1]"),
        (dict(entropy_coef_min=0.2, entropy_coef_max=0.1), "entropy_coef_max must be a number >= entropy_coef_min"),
        (dict(entropy_target=-1.0), "entropy_target must be a number >= 0"),
        (dict(entropy_coef_delta=-0.1), "entropy_coef_delta must be a number >= 0"),
        (dict(num_completions_to_print=0), "num_completions_to_print must be None or an int >= 1"),
    ],
)
def test_config_rejects_bad_variant_options(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        GRPOConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(mask_truncated_completions=1), "mask_truncated_completions must be True or False, got 1 (type int)"),
        (dict(use_bias_correction_kl=1), "use_bias_correction_kl must be True or False, got 1 (type int)"),
    ],
)
def test_the_config_and_grpo_loss_refuse_a_loss_flag_of_the_wrong_type_with_type_error(kwargs, message):
    """A value of the wrong type is a TypeError, with the same message wherever it is checked."""
    with pytest.raises(TypeError, match=re.escape(f"GRPOConfig.{message}")):
        GRPOConfig(**kwargs)
    with pytest.raises(TypeError, match=re.escape(f"LossOptions.{message}")):
        grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3), **loss_arguments(kwargs))
    with pytest.raises(TypeError, match=re.escape(f"LossOptions.{message}")):
        LossOptions(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(use_adaptive_entropy="yes"), "use_adaptive_entropy must be True or False, got 'yes' (type str)"),
        (dict(log_completions=1), "log_completions must be True or False, got 1 (type int)"),
    ],
)
def test_config_refuses_a_variant_flag_of_the_wrong_type_with_type_error(kwargs, message):
    with pytest.raises(TypeError, match=re.escape(message)):
        GRPOConfig(**kwargs)


def test_loss_options_are_one_frozen_object_shared_by_config_grpo_loss_and_trainer():
    """Every LossOptions field is a GRPOConfig field with LossOptions' default; grpo_loss's named
    settings are LossOptions fields that take LossOptions' defaults (grpo_loss writes none of them),
    and the rest come only in options."""
    import dataclasses
    import inspect

    config_defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    keyword_defaults = {k: p.default for k, p in inspect.signature(grpo_loss).parameters.items()}
    option_names = [f.name for f in dataclasses.fields(LossOptions)]
    for name in option_names:
        default = getattr(LossOptions(), name)
        assert name not in keyword_defaults, name  # declared once: in LossOptions only, the named ones too
        if name != "max_completion_length":
            assert config_defaults[name] == default, name
    assert set(NAMED_OPTIONS) <= set(option_names)
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -1.5]], requires_grad=True)
    old, adv, mask = logp.detach() + 0.1, torch.tensor([1.0, -1.0]), torch.ones(2, 2)
    by_default, _ = grpo_loss(logp, old, adv, mask)
    explicit, _ = grpo_loss(logp, old, adv, mask, options=LossOptions())
    assert torch.equal(by_default, explicit)
    for name in NAMED_OPTIONS:  # a named setting left out is LossOptions' default of that name
        given, _ = grpo_loss(logp, old, adv, mask, ref_logp=old - 0.2, **{name: getattr(LossOptions(), name)})
        left_out, _ = grpo_loss(logp, old, adv, mask, ref_logp=old - 0.2)
        assert torch.equal(given, left_out), name
    with pytest.raises(ValueError, match=r"got options and also the keyword\(s\) \['beta'\]"):
        grpo_loss(logp, old, adv, mask, options=LossOptions(), beta=0.1)
    options = GRPOConfig(loss_type="dapo", max_new_tokens=7, delta=1.5, entropy_coef=0.1).loss_options()
    assert options == LossOptions(loss_type="dapo", max_completion_length=7, delta=1.5, entropy_coef=0.1)
    assert options.needs_entropy and options.eps_high == 0.2
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.beta = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError, match="options must be a LossOptions"):
        grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3), options={"delta": 2.0})


def test_grpo_loss_declares_no_setting_of_its_own():
    """The loss's settings are named, defaulted and checked in LossOptions only: grpo_loss's
    signature has none of them (it takes the named ones through ``**settings``)."""
    import inspect

    parameters = inspect.signature(grpo_loss).parameters
    option_names = {f.name for f in dataclasses.fields(LossOptions)}
    assert option_names.isdisjoint(parameters), sorted(option_names & set(parameters))
    assert [p.kind for p in parameters.values()].count(inspect.Parameter.VAR_KEYWORD) == 1
    assert len(parameters) == 13  # 4 tensors, 5 optional tensors, options, 2 normalisers, **settings


def test_grpo_loss_refuses_an_unknown_setting_and_names_the_ones_it_takes():
    logp, old, adv, mask = torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3)
    for name in ("betta", "delta", "owner"):  # a typo, a setting that goes in options, LossOptions' InitVar
        with pytest.raises(TypeError) as error:
            grpo_loss(logp, old, adv, mask, **{name: 0.5})
        message = str(error.value)
        assert f"unexpected keyword argument(s) [{name!r}]" in message
        assert all(repr(named) in message for named in NAMED_OPTIONS)  # the valid names, listed
        assert "'delta'" in message and "go in options=LossOptions(...)" in message  # where the others go
    with pytest.raises(TypeError, match=r"\['betta', 'clip'\]"):  # every unknown name, sorted
        grpo_loss(logp, old, adv, mask, clip=0.2, betta=0.1, beta=0.1)


def test_grpo_loss_refuses_a_setting_beside_options_even_at_its_default():
    """Options and a keyword: refused, whatever the keyword's value, so a keyword is never silently ignored."""
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -1.5]])
    old, adv, mask, ref = logp + 0.1, torch.tensor([1.0, -1.0]), torch.ones(2, 2), logp - 0.3
    for options, keywords in [
        (LossOptions(beta=0.1), dict(beta=0.0)),  # LossOptions' default: the old code ignored it and kept 0.1
        (LossOptions(), dict(loss_type="grpo")),  # the options' own value
        (LossOptions(loss_type="dapo"), dict(clip_eps=0.3, beta=0.0)),
    ]:
        with pytest.raises(ValueError, match=re.escape(f"got options and also the keyword(s) {sorted(keywords)}")):
            grpo_loss(logp, old, adv, mask, ref_logp=ref, options=options, **keywords)


@pytest.mark.parametrize(
    "settings",
    [
        dict(),
        dict(loss_type="dapo", clip_eps_high=0.28, beta=0.1, kl_kind="k2"),
        dict(loss_type="dr_grpo", max_completion_length=6, importance_sampling_level="sequence"),
        dict(loss_type="cispo", clip_eps_high=4.0, mask_truncated_completions=True),
        dict(loss_type="sapo", sapo_temperature_pos=0.7, top_entropy_quantile=0.5, entropy_coef=0.05),
        dict(delta=1.6, off_policy_mask_threshold=0.1),
    ],
)
def test_grpo_loss_gives_the_same_bits_with_options_or_keywords(settings):
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 5, generator=gen, dtype=torch.float64)
    old = logp + 0.3 * torch.randn(4, 5, generator=gen, dtype=torch.float64)
    ref = logp + 0.1 * torch.randn(4, 5, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0], dtype=torch.float64)
    tensors = dict(ref_logp=ref, truncated=torch.tensor([False, True, False, False]),
                   entropies=torch.rand(4, 5, generator=gen, dtype=torch.float64))
    named = {k: v for k, v in settings.items() if k in NAMED_OPTIONS}
    others = {k: v for k, v in settings.items() if k not in NAMED_OPTIONS}
    for name, value in others.items():  # no keyword of grpo_loss: declared once, in LossOptions
        with pytest.raises(TypeError, match=name):
            grpo_loss(logp, old, adv, mask, **tensors, **{name: value})
    results = []
    for how in ("keywords", "options"):
        x = logp.clone().requires_grad_(True)
        if how == "options":
            kwargs = {"options": LossOptions(**settings)}
        elif others:  # the unnamed settings first, then the named ones on top
            kwargs = {"options": dataclasses.replace(LossOptions(**others), **named)}
        else:
            kwargs = named
        loss, stats = grpo_loss(x, old, adv, mask, **tensors, **kwargs)
        loss.backward()
        results.append((loss.detach(), x.grad, stats))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    assert results[0][2] == results[1][2]


def test_cispo_accepts_a_cap_above_two():
    assert GRPOConfig(loss_type="cispo", clip_eps_high=4.0).clip_eps_high == 4.0


# ---------------------------------------------------------------------------
# the trainer with each option
# ---------------------------------------------------------------------------


def _length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


@pytest.mark.parametrize(
    "options",
    [
        dict(loss_type="cispo", clip_eps_high=4.0),
        dict(loss_type="sapo"),
        dict(importance_sampling_level="sequence", loss_type="dapo"),
        dict(delta=1.5, num_iterations=2),
        dict(mask_truncated_completions=True, loss_type="dapo"),
        dict(top_entropy_quantile=0.2, entropy_coef=0.01, micro_batch_size=4),
        dict(off_policy_mask_threshold=0.01, num_iterations=2),
        dict(advantage_baseline="rloo", scale_rewards="none"),
        dict(advantage_baseline="batch", scale_rewards="batch"),
        dict(loss_type="luspo", importance_sampling_level="sequence"),
        dict(loss_type="vespo", num_iterations=2),
        dict(beta=0.04, use_bias_correction_kl=True, num_iterations=2),
        dict(use_adaptive_entropy=True, entropy_target=5.0, entropy_coef=0.01, micro_batch_size=4),
        dict(multi_objective_aggregation="normalize_then_sum"),
    ],
)
def test_trainer_steps_with_each_option(options, make_tiny_policy):
    model, tok = make_tiny_policy(seed=4)
    cfg = GRPOConfig(prompts_per_step=2, group_size=4, seed=1, max_new_tokens=3, learning_rate=1e-2, **options)
    trainer = GRPOTrainer(model, tok, _length_reward, cfg)
    before = [p.detach().clone() for p in trainer.grpo_step.params]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = trainer.train_step(make_arithmetic_dataset(8, seed=2, digits=1)[:2])
    assert math.isfinite(row["loss"]) and row["groups_drawn"] == 2
    assert row["reward_std"] > 0 and row["grad_norm"] > 0  # precondition: a learning signal
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.grpo_step.params))


def test_trainer_entropy_options_use_the_gradient_pass_entropy(monkeypatch, make_tiny_policy):
    """entropies reach grpo_loss with a gradient (from the gradient pass), also on the explicit path."""
    seen = []
    real = step_module.grpo_loss

    def spy(*args, **kwargs):
        seen.append(kwargs["entropies"])
        return real(*args, **kwargs)

    monkeypatch.setattr(step_module, "grpo_loss", spy)
    model, tok = make_tiny_policy(seed=4)
    cfg = GRPOConfig(prompts_per_step=2, group_size=4, num_iterations=2, entropy_coef=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        GRPOTrainer(model, tok, partial_credit_reward, cfg).train_step(make_arithmetic_dataset(8, seed=2, digits=1)[:2])
    assert len(seen) == 2 and all(e is not None and e.requires_grad for e in seen)


# ---------------------------------------------------------------------------
# GDPO and adaptive entropy control in the trainer (issue 24)
# ---------------------------------------------------------------------------


def _correct_reward(completions, answer, **kwargs):
    return [1.0 if c.strip().startswith(str(a)) else 0.0 for c, a in zip(completions, answer)]


def _spy_losses(monkeypatch):
    seen = []
    real = step_module.grpo_loss

    def spy(*args, **kwargs):
        loss, stats = real(*args, **kwargs)
        seen.append({"advantages": args[2].detach().clone(), "options": kwargs["options"], "stats": stats})
        return loss, stats

    monkeypatch.setattr(step_module, "grpo_loss", spy)
    return seen


def test_trainer_uses_normalize_then_sum_on_the_reward_functions(monkeypatch, make_tiny_policy):
    """With GDPO the advantages are normalize_then_sum of the per-function rewards (weighted), not of their sum."""
    from grpo_tutorial.advantages import normalize_then_sum
    from grpo_tutorial.rewards import compute_rewards

    seen = _spy_losses(monkeypatch)
    recorded = []
    real_rewards = step_module.compute_rewards

    def spy_rewards(*args, **kwargs):
        out = real_rewards(*args, **kwargs)
        recorded.append(out)
        return out

    monkeypatch.setattr(step_module, "compute_rewards", spy_rewards)
    model, tok = make_tiny_policy(seed=4)
    weights = [1.0, 0.1]
    cfg = GRPOConfig(prompts_per_step=2, group_size=4, seed=1, max_new_tokens=3, reward_weights=weights,
                     multi_objective_aggregation="normalize_then_sum")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        GRPOTrainer(model, tok, [_length_reward, _correct_reward], cfg).train_step(
            make_arithmetic_dataset(8, seed=2, digits=1)[:2])
    assert compute_rewards is real_rewards and len(recorded) == 1
    total, per_fn = recorded[0]
    expected = normalize_then_sum(torch.stack(list(per_fn.values()), dim=1), 4, weights)
    # one update of all 8 completions, in the minibatch's shuffled order
    torch.testing.assert_close(seen[0]["advantages"].sort().values, expected.sort().values)
    summed = group_advantages(total, 4)
    assert (summed - expected).abs().max() > 1e-3  # GDPO's advantages are not GRPO's of the sum


def test_trainer_adaptive_entropy_follows_the_controller_and_resumes_exactly(monkeypatch, tmp_path, make_tiny_policy):
    """Each update applies the controller's coefficient only below the target (none before the first
    measurement), the coefficient follows adapt_entropy_coef of each update's entropy, stays in its bounds,
    reaches the history and survives a checkpoint."""
    from grpo_tutorial.objectives import adapt_entropy_coef, applied_entropy_coef

    seen = _spy_losses(monkeypatch)
    data = make_arithmetic_dataset(64, seed=5, digits=1)
    options = dict(prompts_per_step=2, group_size=4, seed=2, max_new_tokens=4, learning_rate=1e-2, num_iterations=2,
                   micro_batch_size=4, use_adaptive_entropy=True, entropy_coef=0.05, entropy_target=2.65,
                   entropy_coef_delta=0.02, entropy_coef_max=0.08)

    def trainer(**extra):
        model, tok = make_tiny_policy(seed=4)
        return GRPOTrainer(model, tok, _length_reward, GRPOConfig(**options, **extra))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        straight = trainer().train(data, 4, progress=False)
    # replay the controller on the measured entropies: 4 steps x 2 updates x 2 micro-batches
    assert len(seen) == 16
    coef, last = 0.05, math.inf
    applied = []
    for update in range(8):
        parts = seen[2 * update : 2 * update + 2]
        applied.append(applied_entropy_coef(coef, last, 2.65))
        assert all(p["options"].entropy_coef == applied[-1] for p in parts)
        last = sum(p["stats"]["entropy_sum"] for p in parts) / sum(p["stats"]["entropy_tokens"] for p in parts)
        coef = adapt_entropy_coef(coef, last, target=2.65, delta=0.02, coef_min=0.0, coef_max=0.08)
        assert 0.0 <= coef <= 0.08
        if update % 2 == 1:
            assert straight[update // 2]["entropy_coef"] == coef
    assert applied[0] == 0.0 and any(a > 0 for a in applied)  # no bonus before a measurement; then some
    assert len({r["entropy_coef"] for r in straight}) > 1  # the coefficient moved

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer(output_dir=str(tmp_path), checkpoint_every=1).train(data, 2, progress=False)
        resumed = trainer(output_dir=str(tmp_path), checkpoint_every=1).train(data, 4, resume=True, progress=False)
    drop = TIMING_KEYS
    assert [{k: v for k, v in r.items() if k not in drop} for r in resumed] == [
        {k: v for k, v in r.items() if k not in drop} for r in straight
    ]


# ---------------------------------------------------------------------------
# dynamic sampling
# ---------------------------------------------------------------------------


def _half_constant_reward(completions, a, **kwargs):
    """Constant (no signal) for prompts with a < 5, the completion's length otherwise."""
    return [1.0 if ai < 5 else float(len(c)) for c, ai in zip(completions, a)]


def _dynamic_trainer(**overrides):
    model, tok = tiny_model(seed=4)
    cfg = GRPOConfig(prompts_per_step=4, group_size=4, seed=3, max_new_tokens=4, **overrides)
    return GRPOTrainer(model, tok, _half_constant_reward, cfg)


def test_dynamic_sampling_trains_only_on_groups_with_signal_and_logs_the_count(monkeypatch):
    trained = []
    real = step_module.group_advantages

    def spy(rewards, G, **kwargs):
        trained.append(rewards.view(-1, G).clone())
        return real(rewards, G, **kwargs)

    monkeypatch.setattr(step_module, "group_advantages", spy)
    data = make_arithmetic_dataset(64, seed=5, digits=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = _dynamic_trainer().train(data, 3, progress=False)
        dynamic_trainer = _dynamic_trainer(dynamic_sampling=True, max_sampling_rounds=8)
        dynamic = dynamic_trainer.train(data, 3, progress=False)
    assert all(row["groups_drawn"] == 4 for row in plain)
    assert any(row["frac_zero_std"] > 0 for row in plain)  # the control: without it, dead groups train
    assert all(row["frac_zero_std"] == 0.0 for row in dynamic)
    assert any(row["groups_drawn"] > 4 for row in dynamic)
    assert all(row["groups_drawn"] % 4 == 0 for row in dynamic)  # whole rounds of prompts_per_step
    for rewards in trained[3:]:  # the dynamic run's steps
        assert rewards.shape == (4, 4) and bool((rewards.amax(dim=1) > rewards.amin(dim=1)).all())
    # the data position advanced by every drawn row, deterministically
    position = (0, 0)
    for row in dynamic:
        for _ in range(row["groups_drawn"] // 4):
            _, *position = next_batch(data, 4, 3, *position)
    assert (dynamic_trainer.state.epoch, dynamic_trainer.state.index) == tuple(position)


def test_dynamic_sampling_stops_at_the_cap_and_fills_with_zero_std_groups():
    data = [{"prompt": f"{a}+1=", "answer": str(a + 1), "a": a} for a in range(5)]  # every group constant
    trainer = _dynamic_trainer(dynamic_sampling=True, max_sampling_rounds=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = trainer.train(data, 1, progress=False)[0]
    assert row["groups_drawn"] == 12 and row["frac_zero_std"] == 1.0


def test_dynamic_sampling_resumes_exactly(tmp_path):
    data = make_arithmetic_dataset(64, seed=5, digits=1)
    options = dict(dynamic_sampling=True, max_sampling_rounds=6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        straight = _dynamic_trainer(**options).train(data, 3, progress=False)
        first = _dynamic_trainer(**options, output_dir=str(tmp_path), checkpoint_every=1)
        first.train(data, 2, progress=False)
        resumed = _dynamic_trainer(**options, output_dir=str(tmp_path), checkpoint_every=1)
        history = resumed.train(data, 3, resume=True, progress=False)
    drop = TIMING_KEYS
    assert [{k: v for k, v in r.items() if k not in drop} for r in history] == [
        {k: v for k, v in r.items() if k not in drop} for r in straight
    ]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(options=LossOptions(mask_truncated_completions=True)), "needs truncated"),
        (dict(options=LossOptions(mask_truncated_completions=True), truncated=torch.tensor([1, 0])),
         "bool tensor of shape (2,)"),
        (dict(options=LossOptions(top_entropy_quantile=0.2)), "need entropies"),
        (dict(options=LossOptions(entropy_coef=0.1)), "need entropies"),
        (dict(options=LossOptions(entropy_coef=0.1), entropies=torch.zeros(2, 4)), "shape mismatch"),
        (dict(options=LossOptions(), clip_eps=0.3), "got options and also the keyword(s) ['clip_eps']"),
    ],
)
def test_grpo_loss_refuses_bad_variant_arguments(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3), **kwargs)


def test_trainer_masks_truncated_completions_and_counts_only_the_rest(monkeypatch, make_tiny_policy):
    """With mask_truncated_completions, the trainer hands grpo_loss the rollout's truncation flags,
    and dapo's normaliser counts only the tokens of untruncated completions (as TRL's num_items_in_batch)."""
    calls = []
    real = step_module.grpo_loss

    def spy(logp, old, adv, mask, **kwargs):
        calls.append((mask.clone(), kwargs["truncated"].clone(), float(kwargs["num_items_in_batch"])))
        return real(logp, old, adv, mask, **kwargs)

    monkeypatch.setattr(step_module, "grpo_loss", spy)
    model, tok = make_tiny_policy(seed=4)
    cfg = GRPOConfig(prompts_per_step=2, group_size=4, seed=9, max_new_tokens=5, loss_type="dapo",
                     mask_truncated_completions=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = GRPOTrainer(model, tok, partial_credit_reward, cfg).train_step(
            make_arithmetic_dataset(8, seed=2, digits=1)[:2])
    assert 0 < row["frac_truncated"] < 1  # precondition: some, not all, completions were cut off
    (mask, truncated, tokens), = calls
    assert truncated.float().mean().item() == row["frac_truncated"]
    assert tokens == mask[~truncated].sum().item() < mask.sum().item()
