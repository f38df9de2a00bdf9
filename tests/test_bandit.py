"""Chapter 1's bandit: policy-gradient estimators checked against the exact gradient."""

import math

import pytest
import torch

from grpo_tutorial import group_advantages
from grpo_tutorial.chapters.bandit import (
    BASELINES,
    BanditConfig,
    bandit_advantages,
    exact_gradient,
    expected_gradient,
    expected_reward,
    gradient_samples,
    gradient_stats,
    make_bandit,
    policy_gradient_loss,
    prompt_success_rates,
    sample_batches,
    train_bandit,
    zscore_gradient_weight,
)




def random_logits(P: int, K: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(P, K, generator=torch.Generator().manual_seed(seed))


def assert_matches_expectation(samples: torch.Tensor, expected: torch.Tensor, z_max: float = 4.5) -> None:
    """Every coordinate's Monte Carlo mean lies within z_max standard errors of ``expected``."""
    M = samples.shape[0]
    mean = samples.double().mean(dim=0)
    se = samples.double().std(dim=0) / math.sqrt(M)
    z = (mean - expected.double()).abs() / (se + 1e-12)
    assert z.max() < z_max, f"Monte Carlo mean is {z.max():.1f} standard errors from the expectation"


# ---------------------------------------------------------------- the environment


def test_make_bandit_is_deterministic_and_spans_difficulty():
    mu = make_bandit(8, 10, seed=3)
    assert mu.shape == (8, 10)
    assert ((mu > 0) & (mu < 1)).all()
    torch.testing.assert_close(mu, make_bandit(8, 10, seed=3))
    assert not torch.equal(mu, make_bandit(8, 10, seed=4))
    rates = prompt_success_rates(torch.zeros(8, 10), mu)
    assert rates[0] > 0.6 and rates[-1] < 0.1  # easy first prompt, hard last prompt


def test_exact_gradient_by_hand():
    # one prompt, two arms, uniform policy; arm 0 always pays, arm 1 never
    logits = torch.zeros(1, 2)
    mu = torch.tensor([[1.0, 0.0]])
    assert float(expected_reward(logits, mu)) == pytest.approx(0.5)
    torch.testing.assert_close(exact_gradient(logits, mu), torch.tensor([[0.25, -0.25]]))
    # with two prompts J is their mean, so each row's gradient halves
    logits2 = torch.zeros(2, 2)
    mu2 = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    torch.testing.assert_close(exact_gradient(logits2, mu2), torch.tensor([[0.125, -0.125], [0.0, 0.0]]))


def test_exact_gradient_matches_autograd():
    mu = make_bandit(5, 7, seed=1)
    logits = random_logits(5, 7).requires_grad_(True)
    expected_reward(logits, mu).backward()
    torch.testing.assert_close(exact_gradient(logits.detach(), mu), logits.grad)


# ---------------------------------------------------------------- sampling


def test_sample_batches_shapes_distinct_prompts_and_determinism():
    mu = make_bandit(6, 5, seed=0)
    logits = random_logits(6, 5)
    out1 = sample_batches(
        logits, mu, num_batches=50, prompts_per_step=4, group_size=3, generator=torch.Generator().manual_seed(7)
    )
    out2 = sample_batches(
        logits, mu, num_batches=50, prompts_per_step=4, group_size=3, generator=torch.Generator().manual_seed(7)
    )
    prompts, actions, rewards = out1
    assert prompts.shape == (50, 4) and actions.shape == (50, 4, 3) and rewards.shape == (50, 4, 3)
    for a, b in zip(out1, out2):
        assert torch.equal(a, b)
    # B distinct prompts per batch, every prompt used
    assert all(len(set(row.tolist())) == 4 for row in prompts)
    assert set(prompts.flatten().tolist()) == set(range(6))
    assert set(rewards.unique().tolist()) <= {0.0, 1.0}


def test_sampling_frequencies_follow_policy_and_reward_probs():
    # one prompt: action frequencies match the softmax, reward frequencies match mu
    logits = torch.tensor([[1.0, 0.0, -1.0]])
    mu = torch.tensor([[0.9, 0.5, 0.1]])
    _, actions, rewards = sample_batches(
        logits, mu, num_batches=20_000, prompts_per_step=1, group_size=4, generator=torch.Generator().manual_seed(0)
    )
    n = actions.numel()
    freq = torch.bincount(actions.flatten(), minlength=3).double() / n
    pi = torch.softmax(logits[0].double(), dim=0)
    assert (freq - pi).abs().max() < 4.5 * math.sqrt(0.25 / n)
    for k in range(3):
        chosen = rewards[actions == k]
        assert abs(chosen.double().mean() - mu[0, k]) < 4.5 * math.sqrt(0.25 / chosen.numel())


def test_reward_offset_is_added_to_every_reward():
    mu = torch.tensor([[1.0, 0.0]])  # deterministic rewards
    _, actions, rewards = sample_batches(
        torch.zeros(1, 2), mu, num_batches=3, prompts_per_step=1, group_size=5,
        generator=torch.Generator().manual_seed(0), reward_offset=2.5,
    )
    torch.testing.assert_close(rewards, (actions == 0).float() + 2.5)


# ---------------------------------------------------------------- advantages and loss


def test_bandit_advantages_exact_examples():
    rewards = torch.tensor([[[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]]])  # [M=1, B=2, G=4]
    torch.testing.assert_close(bandit_advantages(rewards, "none"), rewards)
    # batch mean over all 8 samples is 5/8
    torch.testing.assert_close(bandit_advantages(rewards, "batch_mean"), rewards - 0.625)
    # group means are 0.5 and 0.75
    torch.testing.assert_close(
        bandit_advantages(rewards, "group_mean"),
        torch.tensor([[[0.5, -0.5, -0.5, 0.5], [0.25, 0.25, 0.25, -0.75]]]),
    )
    torch.testing.assert_close(bandit_advantages(rewards, "group_zscore")[0], group_advantages(rewards[0]))
    values = torch.tensor([[0.2, 0.9]])  # [M, B]
    torch.testing.assert_close(
        bandit_advantages(rewards, "value", values),
        torch.tensor([[[0.8, -0.2, -0.2, 0.8], [0.1, 0.1, 0.1, -0.9]]]),
    )


def test_policy_gradient_loss_by_hand():
    logits = torch.tensor([[0.0, 1.0, 2.0], [0.5, 0.0, -0.5]])  # [P=2, K=3]
    prompts = torch.tensor([[1, 0]])  # [M=1, B=2]
    actions = torch.tensor([[[0, 2], [1, 1]]])  # [1, 2, 2]
    adv = torch.tensor([[[1.0, -1.0], [0.5, 2.0]]])
    logp = torch.log_softmax(logits, dim=-1)
    by_hand = -(1.0 * logp[1, 0] - 1.0 * logp[1, 2] + 0.5 * logp[0, 1] + 2.0 * logp[0, 1]) / 4
    torch.testing.assert_close(policy_gradient_loss(logits, prompts, actions, adv), by_hand)


def test_per_copy_gradients_equal_separate_backward_passes():
    mu = make_bandit(4, 3, seed=0)
    logits = random_logits(4, 3)
    prompts, actions, rewards = sample_batches(
        logits, mu, num_batches=3, prompts_per_step=2, group_size=4, generator=torch.Generator().manual_seed(1)
    )
    adv = bandit_advantages(rewards, "group_mean")
    copies = logits.expand(3, 4, 3).clone().requires_grad_(True)
    policy_gradient_loss(copies, prompts, actions, adv).backward()
    for m in range(3):
        single = logits.clone().requires_grad_(True)
        policy_gradient_loss(single, prompts[m : m + 1], actions[m : m + 1], adv[m : m + 1]).backward()
        torch.testing.assert_close(copies.grad[m], single.grad)


# ---------------------------------------------------------------- bias


@pytest.mark.parametrize("baseline", ["none", "value"])
def test_reinforce_and_fixed_baseline_are_unbiased(baseline):
    mu = make_bandit(4, 5, seed=2)
    logits = random_logits(4, 5, seed=5)
    samples = gradient_samples(
        logits, mu, baseline=baseline, num_batches=40_000, prompts_per_step=2, group_size=3, seed=11
    )
    assert_matches_expectation(samples, exact_gradient(logits, mu))


def test_offset_changes_variance_not_expectation_without_baseline():
    mu = make_bandit(4, 5, seed=2)
    logits = random_logits(4, 5, seed=5)
    kwargs = dict(baseline="none", num_batches=40_000, prompts_per_step=2, group_size=3, seed=11)
    shifted = gradient_samples(logits, mu, reward_offset=3.0, **kwargs)
    assert_matches_expectation(shifted, exact_gradient(logits, mu))
    plain = gradient_samples(logits, mu, **kwargs)
    assert shifted.var(dim=0).sum() > 5 * plain.var(dim=0).sum()


@pytest.mark.parametrize("baseline", ["batch_mean", "group_mean", "group_zscore"])
def test_sample_mean_baselines_match_their_exact_expectation(baseline):
    # G = 2 makes the (1 - 1/G) shrinkage of the mean baselines a factor of 2
    mu = make_bandit(4, 5, seed=2)
    logits = random_logits(4, 5, seed=5)
    samples = gradient_samples(
        logits, mu, baseline=baseline, num_batches=40_000, prompts_per_step=2, group_size=2, seed=12
    )
    expected = expected_gradient(logits, mu, baseline=baseline, prompts_per_step=2, group_size=2)
    assert_matches_expectation(samples, expected)


def test_group_mean_expectation_is_shrunk_not_equal_to_true_gradient():
    mu = make_bandit(4, 5, seed=2)
    logits = random_logits(4, 5, seed=5)
    true = exact_gradient(logits, mu)
    torch.testing.assert_close(
        expected_gradient(logits, mu, baseline="group_mean", prompts_per_step=2, group_size=2), 0.5 * true
    )
    torch.testing.assert_close(
        expected_gradient(logits, mu, baseline="batch_mean", prompts_per_step=2, group_size=2), 0.75 * true
    )
    # and the Monte Carlo mean really is far from the unshrunk gradient
    samples = gradient_samples(
        logits, mu, baseline="group_mean", num_batches=40_000, prompts_per_step=2, group_size=2, seed=12
    )
    with pytest.raises(AssertionError):
        assert_matches_expectation(samples, true)


def test_zscore_weight_for_pairs_is_constant():
    # G = 2: a mixed pair [1, 0] always gets advantages +-0.5 / (std + eps), std = 1/sqrt(2)
    w = 0.5 / (1 / math.sqrt(2) + 1e-4)
    for J in [0.0, 0.1, 0.5, 0.93, 1.0]:
        assert zscore_gradient_weight(J, 2) == pytest.approx(w, rel=1e-9)


def test_zscore_weight_by_hand_for_three():
    # G = 3, eps = 0, sample std. Others' successes m ~ Binomial(2, J).
    # own 1: m=0 -> [1,0,0]: A = (2/3)/std, std = 1/sqrt(3); m=1 -> [1,1,0]: (1/3)/std; m=2: 0
    # own 0: m=0: 0; m=1 -> [0,1,0]: -(1/3)/std; m=2 -> [0,1,1]: -(2/3)/std
    J = 0.3
    s = 1 / math.sqrt(3)
    right = (1 - J) ** 2 * (2 / 3) / s + 2 * J * (1 - J) * (1 / 3) / s
    wrong = 2 * J * (1 - J) * (-1 / 3) / s + J**2 * (-2 / 3) / s
    assert zscore_gradient_weight(J, 3, eps=0.0) == pytest.approx(right - wrong, rel=1e-9)


def test_zscore_weight_approaches_inverse_reward_std_for_large_groups():
    for J in [0.1, 0.5, 0.8]:
        assert zscore_gradient_weight(J, 400, eps=0.0) == pytest.approx(1 / math.sqrt(J * (1 - J)), rel=0.01)


def test_zscore_expectation_reweights_prompts():
    # the expected z-score gradient is the true one with each prompt's row scaled by w(J_p):
    # parallel within a prompt, but rows with different J_p get different weights
    mu = make_bandit(8, 10, seed=0)
    logits = torch.zeros(8, 10)
    true = exact_gradient(logits, mu)
    z = expected_gradient(logits, mu, baseline="group_zscore", prompts_per_step=4, group_size=8)
    rates = prompt_success_rates(logits, mu)
    for p in range(8):
        torch.testing.assert_close(z[p], zscore_gradient_weight(float(rates[p]), 8) * true[p])
    ratios = z.norm(dim=1) / true.norm(dim=1)
    assert ratios.max() / ratios.min() > 1.1


# ---------------------------------------------------------------- variance


def test_baselines_reduce_variance_in_the_expected_order():
    mu = make_bandit(8, 10, seed=0)
    logits = torch.zeros(8, 10)
    true = exact_gradient(logits, mu)
    rel = {}
    for baseline in BASELINES:
        samples = gradient_samples(
            logits, mu, baseline=baseline, num_batches=5000, prompts_per_step=4, group_size=8, seed=1
        )
        rel[baseline] = gradient_stats(samples, true)["relative_variance"]
    assert rel["none"] > 1.5 * rel["batch_mean"]
    assert rel["batch_mean"] > 1.15 * rel["group_mean"]
    assert rel["none"] > 1.5 * rel["group_zscore"]
    assert rel["value"] < rel["group_mean"]  # a perfect critic beats the group estimate of it


def test_reward_offset_leaves_baselined_estimates_unchanged():
    mu = make_bandit(8, 10, seed=0)
    logits = torch.zeros(8, 10)
    kwargs = dict(num_batches=200, prompts_per_step=4, group_size=8, seed=1)
    for baseline in ["batch_mean", "value", "group_mean", "group_zscore"]:
        a = gradient_samples(logits, mu, baseline=baseline, **kwargs)
        b = gradient_samples(logits, mu, baseline=baseline, reward_offset=5.0, **kwargs)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_gradient_stats_by_hand():
    samples = torch.tensor([[[1.0, 0.0]], [[3.0, 0.0]]])  # [M=2, P=1, K=2]
    stats = gradient_stats(samples, torch.tensor([[1.0, 0.0]]))
    assert stats["mean_norm"] == pytest.approx(2.0)
    assert stats["variance"] == pytest.approx(2.0)  # var([1, 3]) with n - 1
    assert stats["relative_variance"] == pytest.approx(0.5)
    assert stats["cos_mean"] == pytest.approx(1.0)
    assert stats["cos_single"] == pytest.approx(1.0)
    stats = gradient_stats(torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]]), torch.tensor([[1.0, 0.0]]))
    assert stats["cos_single"] == pytest.approx(0.5)
    assert stats["cos_mean"] == pytest.approx(1 / math.sqrt(2))


# ---------------------------------------------------------------- training


@pytest.mark.parametrize("baseline", BASELINES)
def test_training_improves_expected_reward(baseline):
    mu = make_bandit(8, 10, seed=0)
    out = train_bandit(mu, BanditConfig(baseline=baseline, learning_rate=4.0, steps=100, seed=0, runs=2))
    curve = out["expected_reward"]
    assert curve.shape == (2, 101) and out["logits"].shape == (2, 8, 10)
    torch.testing.assert_close(curve[:, 0], torch.full((2,), float(expected_reward(torch.zeros(8, 10), mu))))
    torch.testing.assert_close(curve[:, -1], expected_reward(out["logits"], mu))
    assert (curve[:, -1] > curve[:, 0] + 0.15).all()


def test_training_is_deterministic_per_seed_and_runs_differ():
    mu = make_bandit(8, 10, seed=0)
    config = BanditConfig(baseline="group_zscore", steps=20, seed=3, runs=2)
    a = train_bandit(mu, config)["expected_reward"]
    torch.testing.assert_close(a, train_bandit(mu, config)["expected_reward"])
    assert not torch.equal(a[0], a[1])
    other = train_bandit(mu, BanditConfig(baseline="group_zscore", steps=20, seed=4, runs=2))["expected_reward"]
    assert not torch.equal(a, other)


@pytest.mark.parametrize("baseline", ["group_mean", "value"])
def test_training_step_is_sgd_on_the_package_loss(baseline):
    # one step of R = 3 runs equals, run by run, logits - lr * grad of that run's loss on its own batch
    mu = make_bandit(3, 4, seed=0)
    init = random_logits(3, 4, seed=1)
    config = BanditConfig(
        baseline=baseline, group_size=4, prompts_per_step=2, learning_rate=0.7, steps=1, seed=9, runs=3
    )
    after = train_bandit(mu, config, init_logits=init)["logits"]  # [3, 3, 4]
    prompts, actions, rewards = sample_batches(
        init.expand(3, 3, 4), mu, num_batches=3, prompts_per_step=2, group_size=4,
        generator=torch.Generator().manual_seed(9),
    )
    rates = prompt_success_rates(init, mu)  # [P]
    for r in range(3):
        values = rates[prompts[r]][None] if baseline == "value" else None  # [1, B]
        adv = bandit_advantages(rewards[r : r + 1], baseline, values)
        params = init.clone().requires_grad_(True)
        policy_gradient_loss(params, prompts[r : r + 1], actions[r : r + 1], adv).backward()
        torch.testing.assert_close(after[r], init - 0.7 * params.grad)


def test_batched_policies_sample_from_their_own_logits():
    # run 0 always picks arm 0, run 1 always picks arm 1
    logits = torch.tensor([[[30.0, -30.0]], [[-30.0, 30.0]]])  # [R=2, P=1, K=2]
    _, actions, _ = sample_batches(
        logits, torch.tensor([[0.5, 0.5]]), num_batches=2, prompts_per_step=1, group_size=6,
        generator=torch.Generator().manual_seed(0),
    )
    assert (actions[0] == 0).all() and (actions[1] == 1).all()


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(baseline="critic"), ValueError, "baseline"),
        (dict(learning_rate=0.0), ValueError, "learning_rate"),
        (dict(learning_rate=float("nan")), ValueError, "learning_rate"),
        (dict(group_size=1), ValueError, "group_size"),
        (dict(group_size=2.0), TypeError, "group_size"),
        (dict(steps=0), ValueError, "steps"),
        (dict(seed=-1), ValueError, "seed"),
        (dict(runs=0), ValueError, "runs"),
    ],
)
def test_config_rejects_bad_values(kwargs, error, words):
    with pytest.raises(error, match=words):
        BanditConfig(**kwargs)


def test_bad_inputs_name_the_argument():
    mu = make_bandit(4, 3, seed=0)
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="prompts_per_step=5"):
        sample_batches(torch.zeros(4, 3), mu, num_batches=1, prompts_per_step=5, group_size=2, generator=gen)
    with pytest.raises(ValueError, match="success_probs"):
        exact_gradient(torch.zeros(4, 3), mu + 1.0)
    with pytest.raises(ValueError, match="logits has shape"):
        exact_gradient(torch.zeros(4, 2), mu)
    with pytest.raises(TypeError, match="generator"):
        sample_batches(torch.zeros(4, 3), mu, num_batches=1, prompts_per_step=2, group_size=2, generator=0)
    with pytest.raises(ValueError, match="success_rate"):
        zscore_gradient_weight(1.5, 4)
    with pytest.raises(ValueError, match="group_size"):
        zscore_gradient_weight(0.5, 1)
    with pytest.raises(ValueError, match="values"):
        bandit_advantages(torch.zeros(1, 2, 3), "value")
    with pytest.raises(ValueError, match="values must have shape"):
        bandit_advantages(torch.zeros(1, 2, 3), "value", torch.zeros(2, 1))
    with pytest.raises(ValueError, match="baseline"):
        bandit_advantages(torch.zeros(1, 2, 3), "ppo")
    with pytest.raises(ValueError, match="at least 2 samples"):
        gradient_stats(torch.zeros(1, 4, 3), torch.zeros(4, 3))
    with pytest.raises(TypeError, match="config"):
        train_bandit(mu, {"baseline": "none"})
    with pytest.raises(ValueError, match="one per batch"):
        sample_batches(torch.zeros(2, 4, 3), mu, num_batches=3, prompts_per_step=2, group_size=2, generator=gen)
    with pytest.raises(ValueError, match="num_arms"):
        make_bandit(4, 1)
