"""Stage 5 (update): the clipped surrogate, its aggregation, and the plain policy-gradient loss."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_tutorial import GRPOConfig, group_advantages, grpo_loss, sequence_logprob_loss
from grpo_tutorial.loss import aggregate_tokens


def _batch(seed=0, N=6, T=7, spread=0.4):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(N, T, generator=g) * 3  # [N, T]
    logp = (old + (torch.rand(N, T, generator=g) * 2 - 1) * spread).requires_grad_()
    adv = torch.randn(N, generator=g)
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    return logp, old, adv, mask


def _hand_gradient(logp, old, adv, mask, eps_low, eps_high, loss_type, tmax=None, ref=None, beta=0.0):
    """d loss / d logp derived by hand: -A * ratio where the unclipped branch is active."""
    ratio = torch.exp(logp.detach() - old)
    A = adv[:, None]
    clipped = ((A > 0) & (ratio > 1 + eps_high)) | ((A < 0) & (ratio < 1 - eps_low))
    per_token = torch.where(clipped, torch.zeros_like(ratio), -A * ratio)
    if ref is not None:
        per_token = per_token + beta * (1 - torch.exp(ref - logp.detach()))  # d k3 / d logp
    N, T = mask.shape
    if loss_type == "grpo":
        weight = 1.0 / (N * mask.sum(dim=1, keepdim=True))
    elif loss_type in ("bnpo", "dapo"):
        weight = 1.0 / mask.sum()
    else:
        weight = 1.0 / (N * (tmax or T))
    return per_token * mask * weight


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("eps_high", [None, 0.28])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gradient_matches_hand_derivation(loss_type, eps_high, seed):
    logp, old, adv, mask = _batch(seed)
    loss, _ = grpo_loss(logp, old, adv, mask, clip_eps=0.2, clip_eps_high=eps_high, loss_type=loss_type)
    loss.backward()
    expected = _hand_gradient(logp, old, adv, mask, 0.2, eps_high or 0.2, loss_type)
    torch.testing.assert_close(logp.grad, expected)


def test_gradient_with_kl_penalty_matches_hand_derivation():
    logp, old, adv, mask = _batch(3)
    ref = old - 0.3 * torch.rand(old.shape, generator=torch.Generator().manual_seed(9))
    loss, stats = grpo_loss(logp, old, adv, mask, ref_logp=ref, beta=0.04)
    loss.backward()
    expected = _hand_gradient(logp, old, adv, mask, 0.2, 0.2, "grpo", ref=ref, beta=0.04)
    torch.testing.assert_close(logp.grad, expected)
    assert stats["kl"] > 0


def test_ratio_one_beta_zero_loss_is_zero_but_gradient_is_not():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.2, 0.9, 0.4, 0.4]])
    adv = group_advantages(rewards).view(-1)  # [8], sums to zero per group
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(8, 6, generator=g)).requires_grad_()
    lengths = torch.tensor([1, 6, 3, 2, 6, 5, 4, 6])
    mask = (torch.arange(6)[None, :] < lengths[:, None]).float()
    loss, stats = grpo_loss(logp, logp.detach(), adv, mask, beta=0.0)
    assert abs(loss.item()) < 1e-6
    assert stats["ratio_mean"] == 1.0 and stats["clip_frac"] == 0.0
    loss.backward()
    # d loss / d logp_{i,t} = -A_i / (N * L_i) on real tokens
    expected = -adv[:, None] / (8 * lengths[:, None].float()) * mask
    torch.testing.assert_close(logp.grad, expected)
    assert logp.grad.abs().sum() > 0


def test_clipping_zeroes_gradient_exactly_where_it_should():
    # one token per row; eps = 0.2
    ratios = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.1, 0.9, 1.15, 0.85])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    old = torch.full((8, 1), -1.0)
    logp = (old + torch.log(ratios)[:, None]).requires_grad_()
    loss, stats = grpo_loss(logp, old, adv, torch.ones(8, 1))
    loss.backward()
    grad = logp.grad[:, 0]
    zero = grad == 0
    # A>0 & ratio>1.2 (row 0) and A<0 & ratio<0.8 (row 3) are clipped: no gradient.
    assert zero.tolist() == [True, False, False, True, False, False, False, False]
    # the pessimistic min keeps the gradient on the "wrong" side: A>0 with ratio 0.5 still pushes up
    assert grad[2] < 0 and grad[1] > 0
    assert stats["clip_frac_high"] == pytest.approx(1 / 8)
    assert stats["clip_frac_low"] == pytest.approx(1 / 8)
    assert stats["clip_frac"] == pytest.approx(2 / 8)


def test_clip_higher_lets_positive_advantages_grow_further():
    old = torch.full((1, 1), -2.0)
    logp = (old + torch.log(torch.tensor([[1.25]]))).requires_grad_()
    adv = torch.tensor([1.0])
    loss, _ = grpo_loss(logp, old, adv, torch.ones(1, 1), clip_eps=0.2)
    loss.backward()
    assert logp.grad.item() == 0.0
    logp.grad = None
    loss, _ = grpo_loss(logp, old, adv, torch.ones(1, 1), clip_eps=0.2, clip_eps_high=0.28)
    loss.backward()
    assert logp.grad.item() == pytest.approx(-1.25)


def test_each_loss_type_normalises_as_computed_by_hand():
    # per-token loss at ratio 1 is -A; row 0 has 1 token, row 1 has 3 tokens, T = 4
    logp = torch.zeros(2, 4)
    adv = torch.tensor([2.0, 1.0])
    mask = torch.tensor([[1.0, 0, 0, 0], [1, 1, 1, 0]])
    expected = {
        "grpo": (-2.0 / 1 + -3.0 / 3) / 2,  # mean over each sequence, then over sequences
        "bnpo": (-2.0 - 3.0) / 4,  # all tokens / number of tokens
        "dapo": (-2.0 - 3.0) / 4,
        "dr_grpo": (-2.0 - 3.0) / (2 * 4),  # / (N * max_completion_length)
    }
    for loss_type, value in expected.items():
        loss, _ = grpo_loss(logp, logp, adv, mask, loss_type=loss_type)
        assert loss.item() == pytest.approx(value), loss_type
    loss, _ = grpo_loss(logp, logp, adv, mask, loss_type="dr_grpo", max_completion_length=10)
    assert loss.item() == pytest.approx(-5.0 / 20)


def test_length_bias_of_sequence_mean():
    """Under "grpo" a token of a long completion weighs less than one of a short completion."""
    per_token = torch.ones(2, 10)
    mask = torch.zeros(2, 10)
    mask[0, :2] = 1
    mask[1, :10] = 1
    per_token.requires_grad_()
    aggregate_tokens(per_token, mask, "grpo").backward()
    assert per_token.grad[0, 0] / per_token.grad[1, 0] == pytest.approx(5.0)
    per_token.grad = None
    aggregate_tokens(per_token, mask, "dapo").backward()
    assert per_token.grad[0, 0] == per_token.grad[1, 0]


def test_padding_tokens_get_no_gradient_and_do_not_change_the_loss():
    logp, old, adv, mask = _batch(5)
    loss, _ = grpo_loss(logp, old, adv, mask)
    loss.backward()
    assert torch.equal(logp.grad * (1 - mask), torch.zeros_like(mask))
    garbage = logp.detach() + (1 - mask) * 100.0  # change only padded positions
    loss2, _ = grpo_loss(garbage, old, adv, mask)
    assert loss2.item() == pytest.approx(loss.item())


def test_stats_are_plain_floats_and_kl_is_nan_without_reference():
    logp, old, adv, mask = _batch(1)
    _, stats = grpo_loss(logp, old, adv, mask)
    assert set(stats) == {"clip_frac_low", "clip_frac_high", "clip_frac", "kl", "ratio_mean", "ratio_max", "adv_mean", "adv_std"}
    assert all(type(v) is float for v in stats.values())
    assert stats["kl"] != stats["kl"]  # NaN: not measured
    assert stats["ratio_max"] >= stats["ratio_mean"]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["grpo", "dapo", "dr_grpo"]))
def test_loss_is_never_below_the_unclipped_surrogate(seed, loss_type):
    """The clipped objective is a pessimistic (lower) bound: loss >= unclipped loss."""
    logp, old, adv, mask = _batch(seed, spread=1.0)
    loss, _ = grpo_loss(logp, old, adv, mask, loss_type=loss_type)
    unclipped = aggregate_tokens(-torch.exp(logp - old) * adv[:, None], mask, loss_type)
    assert loss.item() >= unclipped.item() - 1e-6


@pytest.mark.parametrize(
    "change, error, message",
    [
        ({"old_logp": torch.zeros(3, 5)}, ValueError, "shape mismatch"),
        ({"advantages": torch.zeros(2)}, ValueError, "one advantage per completion"),
        ({"mask": torch.zeros(3, 4)}, ValueError, "all zeros"),
        ({"clip_eps": 1.5}, ValueError, r"LossOptions.clip_eps must be a number in \(0, 1\), e.g. 0.2, got 1.5"),
        ({"clip_eps": 0.0}, ValueError, r"LossOptions.clip_eps must be a number in \(0, 1\), e.g. 0.2, got 0.0"),
        ({"beta": -0.1}, ValueError, r"LossOptions.beta must be a number >= 0 \(0 = no KL penalty\), got -0.1"),
        ({"beta": 0.1}, ValueError, "needs ref_logp"),
        ({"loss_type": "ppo"}, ValueError, "loss_type must be one of"),
        ({"logp": torch.zeros(3, 4, dtype=torch.long)}, TypeError, "floating-point"),
        ({"logp": [[0.0]]}, TypeError, "torch.Tensor"),
        ({"advantages": torch.zeros(3, 1)}, ValueError, "advantages must have 1 dimensions"),
    ],
)
def test_bad_input(change, error, message):
    args = {"logp": torch.zeros(3, 4), "old_logp": torch.zeros(3, 4), "advantages": torch.zeros(3), "mask": torch.ones(3, 4)}
    kwargs = {}
    for key, value in change.items():
        (args if key in args else kwargs)[key] = value
    with pytest.raises(error, match=message):
        grpo_loss(args["logp"], args["old_logp"], args["advantages"], args["mask"], **kwargs)


def test_sequence_logprob_loss_value_and_gradient():
    seq_logp = torch.tensor([-3.0, -1.0, -2.0, -4.0], requires_grad=True)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    loss = sequence_logprob_loss(seq_logp, adv)
    assert loss.item() == pytest.approx(-(-3.0 + 1.0 - 1.0 + 2.0) / 4)
    loss.backward()
    torch.testing.assert_close(seq_logp.grad, -adv / 4)
    with pytest.raises(ValueError, match="shape"):
        sequence_logprob_loss(seq_logp, adv[:3])


def test_kl_penalty_at_padded_positions_cannot_poison_the_gradient():
    """A pad token the policy finds absurd (logp -200) must not give NaN gradients."""
    logp = torch.tensor([[-1.0, -200.0]], requires_grad=True)
    ref = torch.tensor([[-1.2, -0.5]])
    loss, stats = grpo_loss(logp, logp.detach(), torch.tensor([1.0]), torch.tensor([[1.0, 0.0]]), ref_logp=ref, beta=0.04)
    loss.backward()
    assert torch.isfinite(logp.grad).all() and logp.grad[0, 1] == 0
    assert stats["kl"] == pytest.approx(float(torch.expm1(torch.tensor(-0.2)) + 0.2))


def test_the_loss_takes_any_clip_above_zero_but_a_training_config_keeps_it_below_one():
    """Chapter 4 switches the clip off with clip_eps_high=1e6 (and clip_eps near 1): grpo_loss must take it,
    giving the unclipped surrogate -mean(ratio * A); a GRPOConfig (a training run) refuses it outside CISPO."""
    logp = torch.tensor([[-0.5, -1.0]], dtype=torch.float64)
    old = torch.tensor([[-1.5, -0.2]], dtype=torch.float64)  # ratios e^1 and e^-0.8, far outside any clip
    for advantage in (1.0, -1.0):
        adv = torch.tensor([advantage], dtype=torch.float64)
        loss, stats = grpo_loss(logp, old, adv, torch.ones(1, 2, dtype=torch.float64),
                                clip_eps=1 - 1e-6, clip_eps_high=1e6)
        expected = -(torch.exp(logp - old) * advantage).mean()
        assert loss.item() == pytest.approx(expected.item(), rel=1e-12) and stats["clip_frac"] == 0.0
    with pytest.raises(ValueError, match=r"clip_eps_high must be None or a number in \(0, 1\)"):
        GRPOConfig(clip_eps_high=1e6)
    GRPOConfig(loss_type="cispo", clip_eps_high=4.0)  # CISPO's cap lies far above 2
