"""PPO's formulas (grpo_tutorial/ppo/formulas.py): each checked by hand on a small example and against a plain loop.

TRL 1.16 ships no PPO helpers to test against (no ``masked_whiten``, ``cliprange_value``,
``compute_advantages`` or GAE anywhere in the installed package: its old PPO trainer is gone),
so the independent reference is written here, differently: GAE as the loop from the last token
back (``A_t = delta_t + gamma lambda A_{t+1}``) where the package multiplies by a discount matrix;
whitening, the value loss and the explained variance with Python's ``statistics`` over lists.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
import torch

from grpo_tutorial import GRPOConfig
from grpo_tutorial.loss import grpo_loss
from grpo_tutorial.ppo import (
    NO_CRITIC_SETTINGS,
    PPOSettings,
    check_critic_config,
    explained_variance,
    gae,
    token_rewards,
    value_loss,
    whiten,
)


def loop_gae(rewards, values, mask, gamma, lam):
    """GAE row by row, from each completion's last real token back; lists of floats in, lists out."""
    advantages, returns = [], []
    for r, v, m in zip(rewards, values, mask):
        length = int(sum(m))
        row_adv, next_value, running = [0.0] * len(m), 0.0, 0.0  # after the last token: V = 0, A = 0
        for t in reversed(range(length)):
            delta = r[t] + gamma * next_value - v[t]
            running = delta + gamma * lam * running
            row_adv[t] = running
            next_value = v[t]
        advantages.append(row_adv)
        returns.append([a + v[t] if t < length else 0.0 for t, a in enumerate(row_adv)])
    return advantages, returns


def random_batch(seed: int, n: int = 5, t: int = 7):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    lengths[0] = t  # one completion that fills the budget (truncated): its last token is the batch's last
    mask = (torch.arange(t)[None, :] < lengths[:, None]).double()  # [n, t], each row 1s then 0s
    return torch.randn(n, t, generator=g, dtype=torch.float64), torch.randn(n, t, generator=g, dtype=torch.float64), mask


# ---------------------------------------------------------------------------
# GAE
# ---------------------------------------------------------------------------


def test_gae_by_hand():
    """Two rows worked on paper: the first (gamma 1, lambda 1/2), the second with padding (gamma 1/2, lambda 1)."""
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.25, 0.5]], dtype=torch.float64)
    # deltas: 0 + 0.25 - 0.5 = -0.25, 0 + 0.5 - 0.25 = 0.25, 1 + 0 - 0.5 = 0.5
    # A_2 = 0.5, A_1 = 0.25 + 0.5 * 0.5 = 0.5, A_0 = -0.25 + 0.5 * 0.5 = 0; R = A + V
    adv, ret = gae(rewards, values, torch.ones(1, 3), gamma=1.0, lam=0.5)
    assert adv.tolist() == [[0.0, 0.5, 0.5]] and ret.tolist() == [[0.5, 0.75, 1.0]]
    rewards = torch.tensor([[0.0, 2.0, 5.0]], dtype=torch.float64)  # 5 and 7: padding, never read
    values = torch.tensor([[1.0, 0.5, 7.0]], dtype=torch.float64)
    # deltas: 0 + 0.5 * 0.5 - 1 = -0.75, 2 + 0.5 * 0 - 0.5 = 1.5 (the value after the last token is 0)
    # A_1 = 1.5, A_0 = -0.75 + 0.5 * 1.5 = 0; R_0 = 1 = 0.5 * 2, the discounted reward
    adv, ret = gae(rewards, values, torch.tensor([[1.0, 1.0, 0.0]]), gamma=0.5, lam=1.0)
    assert adv.tolist() == [[0.0, 1.5, 0.0]] and ret.tolist() == [[1.0, 2.0, 0.0]]


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.5), (1.0, 1.0), (0.99, 0.0), (0.0, 0.7), (0.5, 1.0)])
@pytest.mark.parametrize("seed", range(4))
def test_gae_matches_the_loop_from_the_end(seed, gamma, lam):
    rewards, values, mask = random_batch(seed)
    adv, ret = gae(rewards, values, mask, gamma, lam)
    want_adv, want_ret = loop_gae(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    torch.testing.assert_close(adv, torch.tensor(want_adv, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ret, torch.tensor(want_ret, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_gamma_and_lambda_one_give_the_monte_carlo_return_minus_the_value():
    rewards, values, mask = random_batch(7)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    for i in range(len(mask)):
        length = int(mask[i].sum())
        for t in range(length):
            monte_carlo = float(rewards[i, t:length].sum())  # the rewards from t to the end of the completion
            assert adv[i, t].item() == pytest.approx(monte_carlo - values[i, t].item(), abs=1e-12)
            assert ret[i, t].item() == pytest.approx(monte_carlo, abs=1e-12)


def test_lambda_zero_gives_the_one_step_td_error():
    rewards, values, mask = random_batch(3)
    adv, _ = gae(rewards, values, mask, gamma=0.9, lam=0.0)
    next_values = torch.cat([values[:, 1:] * mask[:, 1:], torch.zeros(len(mask), 1, dtype=torch.float64)], dim=1)
    torch.testing.assert_close(adv, (rewards + 0.9 * next_values - values) * mask, rtol=0, atol=1e-15)


def test_padding_is_never_read_and_gets_zero():
    rewards, values, mask = random_batch(11)
    adv, ret = gae(rewards, values, mask, 1.0, 0.95)
    padding = mask == 0
    noisy_r, noisy_v = rewards.clone(), values.clone()
    noisy_r[padding], noisy_v[padding] = 1e6, -1e6
    adv2, ret2 = gae(noisy_r, noisy_v, mask, 1.0, 0.95)
    assert padding.any() and torch.equal(adv, adv2) and torch.equal(ret, ret2)
    assert not adv[padding].any() and not ret[padding].any()  # exactly 0: a product with the mask's 0


@pytest.mark.parametrize("mask, message", [
    ([[1.0, 0.0, 1.0]], "1s then 0s"),
    ([[0.0, 0.0, 0.0]], "no real token"),
])
def test_gae_refuses_a_mask_that_is_not_a_completions(mask, message):
    with pytest.raises(ValueError, match=message):
        gae(torch.zeros(1, 3), torch.zeros(1, 3), torch.tensor(mask))


# ---------------------------------------------------------------------------
# The per-token reward: the KL folded in (InstructGPT) or not (GRPO keeps it in the loss)
# ---------------------------------------------------------------------------


def test_token_rewards_put_the_score_on_the_last_real_token():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    got = token_rewards(torch.tensor([2.0, -1.0]), mask)
    assert got.tolist() == [[0.0, 0.0, 2.0], [-1.0, 0.0, 0.0]]


def test_token_rewards_fold_in_the_kl_on_every_real_token():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    kl = torch.tensor([[0.5, 1.0, 2.0], [4.0, 0.25, 8.0]])  # 8.0: padding, never read
    got = token_rewards(torch.tensor([2.0, -1.0]), mask, kl=kl, beta=0.5)
    # r_t = -beta * KL_t, plus the score at the end: 2 - 0.5 * 2 = 1; -1 - 0.5 * 0.25 = -1.125
    assert got.tolist() == [[-0.25, -0.5, 1.0], [-2.0, -1.125, 0.0]]


# ---------------------------------------------------------------------------
# Whitening, the value loss, the explained variance
# ---------------------------------------------------------------------------


def test_whiten_matches_statistics_over_the_masked_entries():
    values, _, mask = random_batch(5)
    real = values[mask.bool()].tolist()
    mean, sd = statistics.mean(real), math.sqrt(statistics.variance(real) + 1e-8)  # Bessel's n - 1, as TRL's
    got = whiten(values, mask)
    want = [[(v - mean) / sd if m else 0.0 for v, m in zip(row, mrow)] for row, mrow in zip(values.tolist(), mask.tolist())]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    kept = got[mask.bool()]
    assert kept.mean().item() == pytest.approx(0.0, abs=1e-12) and kept.var().item() == pytest.approx(1.0, rel=1e-6)
    shifted = whiten(values, mask, shift_mean=False)  # the scale only: the mean comes back
    torch.testing.assert_close(shifted, (got + mean) * mask, rtol=1e-12, atol=1e-12)


def test_whiten_refuses_fewer_than_two_entries():
    with pytest.raises(ValueError, match="at least 2 masked entries"):
        whiten(torch.ones(1, 3), torch.tensor([[1.0, 0.0, 0.0]]))


def test_value_loss_by_hand_unclipped_and_clipped():
    old = torch.zeros(1, 4)
    values = torch.tensor([[1.0, 0.1, 1.0, 3.0]], requires_grad=True)
    returns = torch.tensor([[2.0, 0.0, 0.1, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last token is padding
    # unclipped: (1 - 2)^2 = 1, 0.1^2 = 0.01, 0.9^2 = 0.81 -> 0.5 * mean
    loss, stats = value_loss(values, old, returns, mask)
    assert loss.item() == pytest.approx(0.5 * (1 + 0.01 + 0.81) / 3) and stats["value_clipfrac"] == 0
    # clipped to old +- 0.2: V_clip = 0.2, 0.1, 0.2 -> errors 3.24, 0.01, 0.01; the larger: 3.24, 0.01, 0.81
    loss, stats = value_loss(values, old, returns, mask, cliprange_value=0.2)
    assert loss.item() == pytest.approx(0.5 * (3.24 + 0.01 + 0.81) / 3)
    assert stats["value_clipfrac"] == pytest.approx(1 / 3)  # only the first token's clipped error was the larger
    loss.backward()
    assert values.grad[0, 0].item() == 0  # the clipped term won and its value sits outside the range: no gradient
    assert values.grad[0, 2].item() == pytest.approx((1.0 - 0.1) / 3)  # 0.5 * 2 (V - R) / 3 tokens
    assert values.grad[0, 3].item() == 0  # padding


def test_value_loss_of_micro_batches_adds_up_to_the_whole():
    values, returns, mask = random_batch(2, n=6)
    whole, _ = value_loss(values, values * 0.5, returns, mask, cliprange_value=0.3)
    parts = [value_loss(values[i:i + 2], values[i:i + 2] * 0.5, returns[i:i + 2], mask[i:i + 2], 0.3,
                        num_tokens=mask.sum())[0] for i in (0, 2, 4)]
    assert sum(p.item() for p in parts) == pytest.approx(whole.item(), rel=1e-12)


def test_explained_variance_by_hand():
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    returns = torch.tensor([[0.0, 2.0, 4.0, 100.0]])
    # R - V = [0, 1, 0]: variance 2/9; Var(R) = 8/3; 1 - (2/9) / (8/3) = 11/12
    assert explained_variance(torch.tensor([[0.0, 1.0, 4.0, -5.0]]), returns, mask) == pytest.approx(11 / 12, rel=1e-6)
    assert explained_variance(returns.clone(), returns, mask) == pytest.approx(1.0)  # a perfect critic
    assert explained_variance(torch.full((1, 4), 3.0), returns, mask) == pytest.approx(0.0, abs=1e-6)  # a constant
    assert math.isnan(explained_variance(torch.zeros(1, 4), torch.ones(1, 4), mask))  # the returns do not vary


def test_explained_variance_matches_statistics():
    values, returns, mask = random_batch(9)
    keep = mask.bool()
    r, v = returns[keep].tolist(), values[keep].tolist()
    want = 1 - statistics.pvariance([a - b for a, b in zip(r, v)]) / statistics.pvariance(r)
    assert explained_variance(values, returns, mask) == pytest.approx(want, rel=1e-9)


# ---------------------------------------------------------------------------
# grpo_loss with one advantage per token
# ---------------------------------------------------------------------------


def loss_batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(3, 4, generator=g) * 2).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(3, 4, generator=g)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    return logp, old, torch.randn(3, generator=g), mask


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo"])
def test_per_token_advantages_that_repeat_one_per_completion_give_the_same_loss(loss_type):
    logp, old, adv, mask = loss_batch(0)
    ref = old - 0.1
    a, stats_a = grpo_loss(logp, old, adv, mask, loss_type=loss_type, beta=0.04, ref_logp=ref)
    (grad_a,) = torch.autograd.grad(a, logp)
    b, stats_b = grpo_loss(logp, old, adv[:, None].expand(3, 4).clone(), mask, loss_type=loss_type, beta=0.04,
                           ref_logp=ref)
    (grad_b,) = torch.autograd.grad(b, logp)
    assert torch.equal(a, b) and torch.equal(grad_a, grad_b)
    assert stats_a["clip_frac"] == stats_b["clip_frac"] and stats_a["kl"] == stats_b["kl"]


def test_per_token_loss_by_hand_on_policy():
    """At ratio 1 the clipped surrogate is -A per token: grpo's loss is -mean_i(mean over i's tokens of A_it)."""
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -9.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 2.0, 3.0], [-4.0, 2.0, 100.0]])  # 100: padding
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss, stats = grpo_loss(logp, logp.detach(), adv, mask)
    assert loss.item() == pytest.approx(-((1 + 2 + 3) / 3 + (-4 + 2) / 2) / 2)
    assert stats["adv_mean"] == pytest.approx((1 + 2 + 3 - 4 + 2) / 5)  # over the real tokens
    assert stats["adv_std"] == pytest.approx(statistics.stdev([1, 2, 3, -4, 2]), rel=1e-6)
    loss.backward()
    # d/dlogp of -A * exp(logp - old) at ratio 1, / tokens of the row / rows
    torch.testing.assert_close(logp.grad, torch.tensor([[-1 / 6, -2 / 6, -3 / 6], [4 / 4, -2 / 4, 0.0]]))


@pytest.mark.parametrize("options, message", [
    ({"loss_type": "vespo"}, "loss_type='vespo'"),
])
def test_per_token_advantages_are_refused_where_the_loss_reads_one_sign_per_completion(options, message):
    logp, old, adv, mask = loss_batch(1)
    with pytest.raises(ValueError, match=message):
        grpo_loss(logp, old, torch.zeros(3, 4), mask, **options)
    from grpo_tutorial.loss import LossOptions

    with pytest.raises(ValueError, match="off_policy_mask_threshold"):
        grpo_loss(logp, old, torch.zeros(3, 4), mask, options=LossOptions(off_policy_mask_threshold=0.5))
    grpo_loss(logp, old, adv, mask, options=LossOptions(off_policy_mask_threshold=0.5))  # [N]: as before


# ---------------------------------------------------------------------------
# The settings, and what a critic refuses
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gamma", "lam"])
@pytest.mark.parametrize("value, error", [(-0.1, ValueError), (1.5, ValueError), (float("nan"), ValueError),
                                          ("0.9", TypeError), (True, TypeError), (None, TypeError)])
def test_gamma_and_lambda_outside_zero_one_are_refused(name, value, error):
    with pytest.raises(error, match=rf"PPOSettings\.{name} must be a number in \[0, 1\]"):
        PPOSettings(**{name: value})


def test_gamma_and_lambda_at_the_ends_are_taken():
    assert PPOSettings(gamma=0, lam=1).lam == 1 and PPOSettings(gamma=1.0, lam=0.0).gamma == 1.0
    with pytest.raises(ValueError, match=r"gamma must be a number in \[0, 1\]"):
        gae(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), gamma=1.01)


@pytest.mark.parametrize("change, message", [
    ({"value_lr": -1e-3}, "value_lr must be a number >= 0"),
    ({"cliprange_value": 0.0}, "cliprange_value must be None"),
    ({"kl_in_reward": 1}, "kl_in_reward must be True or False"),
    ({"value_warmup_steps": -1}, "value_warmup_steps must be an int >= 0"),
    ({"whiten": "yes"}, "whiten must be True or False"),
    ({"value_model": "shared"}, "value_model must be one of"),
])
def test_bad_settings_are_refused(change, message):
    with pytest.raises((ValueError, TypeError), match=message):
        PPOSettings(**change)


#: One non-default value of each setting that assumes no critic (and loss_type's two refused values).
CONFLICTS = {
    "advantage_baseline": {"advantage_baseline": "rloo"},
    "scale_rewards": {"scale_rewards": "none"},
    "multi_objective_aggregation": {"multi_objective_aggregation": "normalize_then_sum"},
    "dynamic_sampling": {"dynamic_sampling": True},
    "importance_sampling_level": {"importance_sampling_level": "sequence"},
    "loss_type": {"loss_type": "vespo"},
    "off_policy_mask_threshold": {"off_policy_mask_threshold": 0.5},
    "use_peft": {"use_peft": True},
}


def test_every_setting_that_assumes_no_critic_has_a_case():
    assert set(CONFLICTS) == set(NO_CRITIC_SETTINGS)


@pytest.mark.parametrize("name", sorted(CONFLICTS))
def test_settings_that_assume_no_critic_are_refused_one_message_each(name):
    config = GRPOConfig(**CONFLICTS[name])
    with pytest.raises(ValueError, match=rf"GRPOConfig\.{name} must be .* with a value model \(PPO\)") as caught:
        check_critic_config(config, PPOSettings())
    assert NO_CRITIC_SETTINGS[name][1] in str(caught.value)  # the reason, as the docs give it
    assert f"``{name}" in check_critic_config.__doc__  # and the docs name it


def test_luspo_and_the_kl_in_the_reward_without_beta_are_refused():
    with pytest.raises(ValueError, match="importance_sampling_level"):  # LUSPO needs GSPO's sequence ratio
        check_critic_config(GRPOConfig(loss_type="luspo", importance_sampling_level="sequence"), PPOSettings())
    with pytest.raises(ValueError, match=r"PPOSettings\.kl_in_reward must be False with beta = 0"):
        check_critic_config(GRPOConfig(beta=0.0), PPOSettings(kl_in_reward=True))
    with pytest.raises(TypeError, match="settings must be a PPOSettings"):
        check_critic_config(GRPOConfig(), {"gamma": 1.0})


def test_settings_that_do_not_conflict_are_taken():
    for changes in ({}, {"loss_type": "dapo", "num_iterations": 2}, {"beta": 0.04, "kl_kind": "k1"},
                    {"loss_type": "dr_grpo", "entropy_coef": 0.01}, {"mask_truncated_completions": True}):
        check_critic_config(GRPOConfig(**changes), PPOSettings(kl_in_reward="beta" in changes))


def test_the_docs_name_each_refused_combination():
    """architecture.md names the refusals' home; the module says why the value clip is not the PPO paper's."""
    import grpo_tutorial.ppo.formulas as ppo

    text = ppo.__doc__ + PPOSettings.__doc__
    assert "eq. 9" in text and "ppo2" in text and "cliprange_value" in text
    page = (Path(__file__).resolve().parent.parent / "book" / "architecture.md").read_text()
    assert "NO_CRITIC_SETTINGS" in page


def test_what_a_critic_allows_is_said_as_the_check_applies_it():
    """Chapter 17 prints each refused setting with what a value model allows: loss_type is refused only for VESPO and
    LUSPO (every other loss type passes), so it is not "None only" (issue 53, item 11)."""
    from grpo_tutorial.ppo import allowed_with_a_critic

    assert allowed_with_a_critic("loss_type") == "any but 'vespo' and 'luspo'"
    assert allowed_with_a_critic("scale_rewards") == "'group' only"
    for loss_type in ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo"):
        check_critic_config(GRPOConfig(loss_type=loss_type), PPOSettings())
    with pytest.raises(ValueError, match="any but 'vespo' and 'luspo'"):
        check_critic_config(GRPOConfig(loss_type="vespo"), PPOSettings())
    with pytest.raises(ValueError, match="with a value model"):  # LUSPO needs GSPO's sequence ratio, refused too
        check_critic_config(GRPOConfig(loss_type="luspo", importance_sampling_level="sequence"), PPOSettings())
    with pytest.raises(ValueError, match="name must be one of"):
        allowed_with_a_critic("learning_rate")
