"""Stage 3: group-relative advantages."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_tutorial import group_advantages, grpo_loss

SEED_REWARDS = [0.8, 0.3, 0.6, 0.2, 0.7]


def test_seed_example_sample_std():
    adv = group_advantages(torch.tensor([SEED_REWARDS]))
    expected = torch.tensor([[1.08, -0.85, 0.31, -1.24, 0.70]])
    assert torch.allclose(adv.round(decimals=2), expected)


def test_seed_example_population_std_matches_numpy():
    r = np.array(SEED_REWARDS)
    expected = (r - r.mean()) / (r.std() + 1e-4)  # numpy's std is the population std
    adv = group_advantages([SEED_REWARDS], std="population")
    np.testing.assert_allclose(adv[0].numpy(), expected, rtol=1e-5)
    # the two conventions differ by sqrt(G / (G - 1)) (up to eps)
    sample = group_advantages([SEED_REWARDS], std="sample", eps=0.0)
    population = group_advantages([SEED_REWARDS], std="population", eps=0.0)
    torch.testing.assert_close(population / sample, torch.full((1, 5), (5 / 4) ** 0.5))


def test_flat_input_is_grouped_in_order():
    flat = torch.tensor([1.0, 0.0, 0.0, 5.0, 5.0, 7.0])
    torch.testing.assert_close(
        group_advantages(flat, group_size=3), group_advantages(flat.view(2, 3)).view(-1)
    )
    # first group is [1, 0, 0]: its first member is the only winner
    adv = group_advantages(flat, group_size=3)
    assert adv[0] > 0 and adv[1] < 0 and adv[1] == adv[2]


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 5),
    st.integers(2, 8),
    st.sampled_from(["group", "batch", "none"]),
    st.sampled_from(["sample", "population"]),
    st.integers(0, 10_000),
)
def test_advantages_sum_to_zero_per_group(P, G, scale, std, seed):
    g = torch.Generator().manual_seed(seed)
    # float64: the invariant is exact arithmetic; in float32 a group whose two rewards
    # differ by 0.01 amplifies the mean's rounding error (~6e-8) by 1/std ~ 200
    rewards = (torch.randint(0, 3, (P, G), generator=g).float() * torch.rand(P, G, generator=g)).double()
    adv = group_advantages(rewards, scale=scale, std=std)
    assert adv.dtype == torch.float64
    torch.testing.assert_close(adv.sum(dim=1), torch.zeros(P, dtype=torch.float64), atol=1e-10, rtol=0)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 16), st.integers(0, 10_000))
def test_sample_std_of_advantages_is_one(G, seed):
    rewards = torch.rand(3, G, generator=torch.Generator().manual_seed(seed)) + 0.01 * torch.arange(G)
    adv = group_advantages(rewards, eps=0.0)
    torch.testing.assert_close(adv.std(dim=1), torch.ones(3), atol=1e-4, rtol=0)


@pytest.mark.parametrize("value", [0.0, 1.0, 0.1, -3.7, 1e6])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_zero_variance_group_gets_exactly_zero(value, scale):
    rewards = torch.tensor([[value] * 7, [0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0]])
    adv = group_advantages(rewards, scale=scale)
    assert torch.equal(adv[0], torch.zeros(7))
    assert adv[1].abs().sum() > 0


def test_zero_variance_group_gives_zero_gradient():
    """A group with equal rewards must not move the policy at all (beta = 0)."""
    torch.manual_seed(0)
    rewards = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 1.0]])
    adv = group_advantages(rewards).view(-1)  # [8]
    logp = (torch.randn(8, 5) - 1.0).requires_grad_()
    old = logp.detach() + 0.05 * torch.randn(8, 5)  # ratio != 1, like a second pass
    mask = torch.ones(8, 5)
    loss, _ = grpo_loss(logp, old, adv, mask)
    loss.backward()
    assert torch.equal(logp.grad[:4], torch.zeros(4, 5))
    assert logp.grad[4:].abs().sum() > 0


def test_batch_scale_divides_by_the_whole_batch_std():
    rewards = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 5.0]])
    adv = group_advantages(rewards, scale="batch", eps=0.0)
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    torch.testing.assert_close(adv, centred / rewards.std())


def test_none_scale_is_mean_centring_only():
    rewards = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    torch.testing.assert_close(group_advantages(rewards, scale="none"), torch.tensor([[-0.75, 0.25, 0.25, 0.25]]))


def test_keeps_dtype_and_accepts_ints():
    assert group_advantages(torch.tensor([[1.0, 0.0]], dtype=torch.float64)).dtype == torch.float64
    assert group_advantages([[1, 0, 0]]).dtype == torch.float32


@pytest.mark.parametrize(
    "rewards, kwargs, message",
    [
        ([[1.0], [0.0]], {}, "at least 2"),
        ([1.0, 0.0, 1.0], {}, "group_size"),
        ([1.0, 0.0, 1.0], {"group_size": 2}, "not a multiple of group_size=2"),
        ([[1.0, 0.0, 1.0]], {"group_size": 2}, "does not match"),
        ([[[1.0, 0.0]]], {}, r"shape \[P, G\]"),
        ([[1.0, float("nan")]], {}, "NaN"),
        ([[1.0, float("inf")]], {}, "NaN or inf"),
        ([[1.0, 0.0]], {"scale": "groups"}, "scale must be one of"),
        ([[1.0, 0.0]], {"std": "unbiased"}, "std must be one of"),
        ([[1.0, 0.0]], {"eps": -1.0}, "eps"),
    ],
)
def test_bad_input_raises_value_error_naming_the_problem(rewards, kwargs, message):
    with pytest.raises(ValueError, match=message):
        group_advantages(rewards, **kwargs)


def test_non_numeric_rewards_raise_type_error():
    with pytest.raises(TypeError, match="rewards"):
        group_advantages([["a", "b"]])


def test_nan_skip_leaves_unscorable_completions_out_of_their_group():
    """One NaN-aware implementation: the trainer calls exactly this (nan="skip")."""
    from grpo_tutorial.advantages import zero_std_groups

    nan = float("nan")
    plain = torch.tensor([1.0, 2.0, 4.0, 4.0, 3.0, 3.0])
    for scale in ("group", "batch", "none"):
        skipped = group_advantages(plain, 3, scale=scale, nan="skip")
        assert torch.equal(skipped, group_advantages(plain, 3, scale=scale))  # no NaN: identical
    assert zero_std_groups(plain, 3).tolist() == [False, False]
    r = torch.tensor([nan, 1.0, 3.0, 5.0, nan, nan, 2.0, 2.0, nan])
    adv = group_advantages(r, 3, scale="none", nan="skip")
    assert adv.tolist() == [0.0, -1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert zero_std_groups(r, 3).tolist() == [False, True, True]  # one scorable member; all equal
    adv = group_advantages(r, 3, scale="group", std="population", nan="skip")
    assert adv[1:3].tolist() == pytest.approx([-1 / (1 + 1e-4), 1 / (1 + 1e-4)])
    # batch scale: the std of the scorable rewards only (1, 3, 5, 2, 2)
    adv = group_advantages(r, 3, scale="batch", nan="skip")
    spread = torch.tensor([1.0, 3.0, 5.0, 2.0, 2.0]).std()
    assert adv[1:3].tolist() == pytest.approx([-1 / (float(spread) + 1e-4), 1 / (float(spread) + 1e-4)])
    assert float(adv.sum()) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="nan='skip'"):
        group_advantages(r, 3)  # the default still refuses NaN
    with pytest.raises(ValueError, match="NaN or inf"):
        group_advantages(torch.tensor([1.0, float("inf"), 2.0]), 3, nan="skip")  # inf is never "unscorable"


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("std", ["sample", "population"])
def test_rloo_with_an_unscorable_reward_is_rloo_without_it(scale, std):
    """One NaN anywhere in the batch sends every group through the NaN-aware path; RLOO's factor
    G'/(G'-1) must survive it (it once cancelled against a std taken after the factor)."""
    nan = float("nan")
    rewards = torch.tensor([[1.0, 2.0, nan, 4.0], [0.0, 1.0, 1.0, 3.0]])
    got = group_advantages(rewards, scale=scale, std=std, nan="skip", baseline="rloo")
    if scale != "batch":  # the batch std depends on which rewards are in the batch: compare group by group
        first = group_advantages(torch.tensor([[1.0, 2.0, 4.0]]), scale=scale, std=std, baseline="rloo")[0]
        second = group_advantages(torch.tensor([[0.0, 1.0, 1.0, 3.0]]), scale=scale, std=std, baseline="rloo")[0]
        torch.testing.assert_close(got[0, [0, 1, 3]], first)
        torch.testing.assert_close(got[1], second)
    # by hand: A = G'/(G'-1) * (r - mean) / (std + eps), G' the scorable members of the group
    r = torch.tensor([1.0, 2.0, 4.0])
    scorable = {"group": r, "batch": torch.tensor([1.0, 2.0, 4.0, 0.0, 1.0, 1.0, 3.0])}
    divide = 1.0 if scale == "none" else scorable[scale].std(unbiased=std == "sample") + 1e-4
    torch.testing.assert_close(got[0, [0, 1, 3]], 1.5 * (r - r.mean()) / divide)
    assert got[0, 2] == 0.0


# ---------------------------------------------------------------------------
# token_variance: the advantage variance chapter 17 compares baselines by, written once
# ---------------------------------------------------------------------------


def test_token_variance_is_the_population_variance_of_the_real_tokens():
    from grpo_tutorial.advantages import token_variance

    advantages = torch.tensor([[1.0, 3.0, 99.0], [5.0, -7.0, 11.0]])  # [N=2, T=3]
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # the real tokens: 1, 3, 5 (99, -7, 11 are padding)
    # mean 3, squared deviations 4 + 0 + 4 over 3 tokens
    assert token_variance(advantages, mask) == pytest.approx(8 / 3, rel=1e-6)
    assert token_variance(advantages, torch.zeros_like(mask)) == 0.0  # no real token: no spread


def test_token_variance_of_one_advantage_a_completion_weights_it_by_its_tokens():
    """GRPO's [N] advantages: every token of a completion carries its completion's, so a long completion
    counts once per token, as the per-token advantages of PPO and the Monte Carlo values do."""
    from grpo_tutorial.advantages import token_variance

    per_completion = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])  # 3 tokens of +2, 1 of -1: mean 1.25
    expected = (3 * 0.75 ** 2 + 2.25 ** 2) / 4
    assert token_variance(per_completion, mask) == pytest.approx(expected, rel=1e-6)
    assert token_variance(per_completion, mask) == token_variance(per_completion[:, None].expand(2, 3), mask)
    with pytest.raises(ValueError, match="do not fit"):
        token_variance(torch.ones(3), mask)
    with pytest.raises(ValueError, match="do not fit"):
        token_variance(torch.ones(2, 2), mask)
