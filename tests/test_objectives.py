"""grpo_tutorial/objectives.py: each piece of the loss on a small example worked out by hand.

``tests/test_loss.py`` checks :func:`grpo_loss`, the pieces in a row, and
``tests/test_trl_agreement.py`` checks them against TRL; here every piece gets
numbers small enough to compute on paper, written next to the assertion, and
the gradient where the piece's point is its gradient (a detached weight, a clip).
"""

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from grpo_tutorial.objectives import (
    AGGREGATIONS,
    LOSS_TYPES,
    OBJECTIVES,
    EntropyControl,
    adapt_entropy_coef,
    aggregate_tokens,
    applied_entropy_coef,
    cispo_objective,
    clipped_surrogate,
    entropy_bonus,
    high_entropy_mask,
    importance_weighted_kl,
    importance_weights,
    masked_log_ratio,
    off_policy_mask,
    per_token_objective,
    sapo_objective,
    truncation_mask,
    vespo_objective,
    vespo_weights,
)


def t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


# ---------------------------------------------------------------------------
# 1. the importance weight
# ---------------------------------------------------------------------------


def test_masked_log_ratio_is_zero_at_padding_and_detaches_the_old_policy():
    logp = t([-1.0, -2.0, 5.0]).requires_grad_(True)
    old = t([-1.5, -1.0, -100.0]).requires_grad_(True)
    out = masked_log_ratio(logp, old, t([1, 1, 0]))
    assert torch.equal(out, t([0.5, -1.0, 0.0]))  # -1 - (-1.5), -2 - (-1), and 0 where padded
    out.sum().backward()
    assert torch.equal(logp.grad, t([1.0, 1.0, 0.0])) and old.grad is None


def test_importance_weights_per_token_and_per_sequence():
    log_ratio, mask = t([0.5, -1.0, 0.0], [0.2, 0.2, 0.2]), t([1, 1, 0], [1, 1, 1])
    token = importance_weights(log_ratio, mask, "token")
    torch.testing.assert_close(token, torch.exp(log_ratio), rtol=0, atol=0)
    seq = importance_weights(log_ratio, mask, "sequence")
    # GSPO: exp of the mean log-ratio over the counted tokens, (0.5 - 1.0) / 2 = -0.25, on every position
    torch.testing.assert_close(seq, t([math.exp(-0.25)] * 3, [math.exp(0.2)] * 3), rtol=1e-15, atol=0)
    with pytest.raises(ValueError, match=r"importance_sampling_level must be one of \['sequence', 'token'\], got 'seq'"):
        importance_weights(log_ratio, mask, "seq")


# ---------------------------------------------------------------------------
# 2. the per-token objectives
# ---------------------------------------------------------------------------


def test_clipped_surrogate_positive_and_negative_advantage():
    ratio = t([0.5, 1.0, 1.5])
    # A = 2: min(r A, clip(r, 0.8, 1.2) A) = min([1, 2, 3], [1.6, 2, 2.4]) = [1, 2, 2.4]
    assert torch.allclose(clipped_surrogate(ratio, t([2.0]), 0.2, 0.2), t([-1.0, -2.0, -2.4]))
    # A = -1: min([-0.5, -1, -1.5], [-0.8, -1, -1.2]) = [-0.8, -1, -1.5]
    assert torch.allclose(clipped_surrogate(ratio, t([-1.0]), 0.2, 0.2), t([0.8, 1.0, 1.5]))
    # clip-higher: the upper end is 1 + 0.28
    assert torch.allclose(clipped_surrogate(t([1.5]), t([1.0]), 0.2, 0.28), t([-1.28]))


def test_clipped_surrogate_delta_caps_the_unclipped_term():
    ratio = t([0.5, 1.0, 3.0])
    # A = -1, delta = 1.3: the ratio term is min(r, 1.3), so 3.0 costs 1.3, not 3.0
    assert torch.allclose(clipped_surrogate(ratio, t([-1.0]), 0.2, 0.2, delta=1.3), t([0.8, 1.0, 1.3]))
    assert torch.allclose(clipped_surrogate(ratio, t([-1.0]), 0.2, 0.2), t([0.8, 1.0, 3.0]))


def test_clipped_surrogate_gives_a_clipped_token_no_gradient():
    ratio = t([0.5, 1.5]).requires_grad_(True)
    clipped_surrogate(ratio, t([2.0]), 0.2, 0.2).sum().backward()
    assert torch.equal(ratio.grad, t([-2.0, 0.0]))  # 0.5 is inside min's unclipped branch; 1.5 is clipped at 1.2


def test_cispo_weight_is_clipped_and_detached_so_a_clipped_token_still_learns():
    ratio = t([0.5, 1.5]).requires_grad_(True)
    logp = t([-1.0, -2.0]).requires_grad_(True)
    loss = cispo_objective(ratio, t([2.0]), logp, 0.2)
    # weight min(r, 1.2) = [0.5, 1.2]; -w A logp = -[0.5 * 2 * -1, 1.2 * 2 * -2] = [1.0, 4.8]
    assert torch.allclose(loss, t([1.0, 4.8]))
    loss.sum().backward()
    assert torch.allclose(logp.grad, t([-1.0, -2.4])) and ratio.grad is None


def test_sapo_gate_value_and_unit_slope_at_ratio_one():
    ratio = t([1.0], [1.0]).requires_grad_(True)
    adv = t([1.0], [-1.0])
    loss = sapo_objective(ratio, adv, temperature_pos=1.0, temperature_neg=2.0)
    # -sigmoid(0) * 4 / tau * A: tau = 1 for A > 0 gives -2, tau = 2 for A <= 0 gives +1
    assert torch.allclose(loss, t([-2.0], [1.0]))
    loss.sum().backward()
    assert torch.allclose(ratio.grad, t([-1.0], [1.0]))  # -4 s (1 - s) A = -A at rho = 1, as the plain surrogate


def test_sapo_uses_the_negative_temperature_for_a_zero_advantage():
    ratio = t([2.0]).requires_grad_(True)
    sapo_objective(ratio, t([0.0]), 1.0, 2.0).sum().backward()
    assert ratio.grad.item() == 0.0  # A = 0: no push either way (and tau_neg = 2 is finite)


def test_vespo_weights_exact_values():
    mask = t([1, 1, 0], [1, 1, 0])
    log_ratio = t([math.log(2), 0.0, 50.0], [math.log(2), 0.0, 50.0])  # the padded 50 is never counted: w = 2
    w = vespo_weights(log_ratio, mask, t([1.0], [-1.0]))
    # phi(w) = e^lam w^k e^(-lam w): A >= 0, (k, lam) = (2, 3): e^3 * 4 * e^-6; A < 0, (3, 2): e^2 * 8 * e^-4
    torch.testing.assert_close(w, t([4 * math.exp(-3)], [8 * math.exp(-2)]), rtol=1e-12, atol=0)
    assert w.shape == (2, 1)
    one = vespo_weights(torch.zeros(1, 3, dtype=torch.float64), t([1, 1, 1]), t([0.5]))
    assert one.item() == pytest.approx(1.0, abs=1e-15)  # phi(1) = 1


def test_vespo_weights_clamp_and_never_carry_a_gradient():
    log_ratio = t([30.0, 30.0], [-30.0, -30.0]).requires_grad_(True)
    w = vespo_weights(log_ratio, t([1, 1], [1, 1]), t([1.0], [1.0]))
    assert not w.requires_grad
    # sum 60 -> 20: phi = exp(3 + 2 * 20 - 3 e^20) = 0; sum -60 -> log 1e-8: phi = e^3 (1e-8)^2 e^(-3e-8)
    assert w[0].item() == 0.0
    assert w[1].item() == pytest.approx(math.exp(3) * 1e-16 * math.exp(-3e-8), rel=1e-9)


def test_vespo_objective_is_a_detached_weight_times_a_times_log_pi():
    weight = t([0.5]).requires_grad_(True)
    logp = t([-1.0, -3.0]).requires_grad_(True)
    loss = vespo_objective(weight, t([2.0]), logp)
    assert torch.allclose(loss, t([1.0, 3.0]))
    loss.sum().backward()
    assert torch.allclose(logp.grad, t([-1.0, -1.0])) and weight.grad is None


def test_per_token_objective_picks_each_loss_types_piece():
    ratio, adv, logp = t([0.5, 1.5]), t([2.0]), t([-1.0, -2.0])
    options = dict(clip_eps=0.2, clip_eps_high=0.2, delta=None, sapo_temperature_pos=1.0, sapo_temperature_neg=1.05,
                   vespo_weight=t([0.5]))
    for name in ("grpo", "bnpo", "dapo", "dr_grpo", "luspo"):
        assert torch.equal(per_token_objective(name, ratio, adv, logp, **options), clipped_surrogate(ratio, adv, 0.2, 0.2))
    assert torch.equal(per_token_objective("cispo", ratio, adv, logp, **options), cispo_objective(ratio, adv, logp, 0.2))
    assert torch.equal(per_token_objective("sapo", ratio, adv, logp, **options), sapo_objective(ratio, adv, 1.0, 1.05))
    assert torch.equal(per_token_objective("vespo", ratio, adv, logp, **options), t([1.0, 2.0]))
    with pytest.raises(ValueError, match="loss_type must be one of .*, got 'ppo'"):
        per_token_objective("ppo", ratio, adv, logp, **options)


def test_every_loss_type_has_an_objective_and_an_aggregation():
    assert set(OBJECTIVES) == set(AGGREGATIONS) == set(LOSS_TYPES)
    assert [name for name, reduce in AGGREGATIONS.items() if reduce is None] == ["dapo", "cispo", "vespo"]


def test_importance_weighted_kl_keeps_the_ratio_in_the_graph():
    kl, ratio = t([0.1, 0.2]), t([1.0, 2.0]).requires_grad_(True)
    out = importance_weighted_kl(kl, ratio)
    assert torch.allclose(out, t([0.1, 0.4]))
    out.sum().backward()
    assert torch.allclose(ratio.grad, kl)  # not detached: the gradient reaches the ratio


# ---------------------------------------------------------------------------
# 3. loss masks
# ---------------------------------------------------------------------------


def test_truncation_mask_drops_the_rows_of_truncated_completions():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.float32)
    out = truncation_mask(mask, torch.tensor([False, True]))
    assert torch.equal(out, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])) and out.dtype == torch.float32


def test_high_entropy_mask_keeps_the_top_fraction_of_counted_tokens():
    # float32, as a model's entropies are: the threshold is computed in float32, so a float64 0.1 would sit a
    # rounding error below float32's 0.1 and quantile 1.0 would drop it
    ent = torch.tensor([[0.1, 0.9, 0.5], [0.3, 0.7, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # the padded 5.0 takes no part
    # counted, sorted: 0.1 0.3 0.5 0.7 0.9; the 0.6 quantile is 0.5 + 0.4 * 0.2 = 0.58: keep 0.7 and 0.9
    assert torch.equal(high_entropy_mask(ent, mask, 0.4), torch.tensor([[False, True, False], [False, True, False]]))
    assert torch.equal(high_entropy_mask(ent, mask, 1.0), mask.bool())  # every counted token
    assert torch.equal(high_entropy_mask(ent, mask, 0.0), torch.tensor([[False, True, False], [False, False, False]]))
    assert not high_entropy_mask(ent, torch.zeros_like(mask), 0.5).any()


def test_high_entropy_mask_keeps_ties_at_the_threshold():
    ent = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert torch.equal(high_entropy_mask(ent, torch.ones(1, 4), 0.25), torch.tensor([[True, True, True, False]]))


def test_off_policy_mask_drops_only_negative_advantages_far_off_policy():
    adv = t([1.0], [-1.0], [-1.0])
    mask = t([1, 1, 0], [1, 1, 0], [1, 1, 0])
    old = t([0.0, 0.0, 9.0], [0.0, 0.0, 9.0], [0.0, 0.0, 9.0])  # the padded 9.0 is never counted
    logp = t([-5.0, -5.0, 0.0], [-0.5, -0.5, 0.0], [-0.1, -0.1, 0.0])
    # mean log(pi_old / pi_theta): 5 (but A > 0: kept), 0.5 > 0.3 (dropped), 0.1 <= 0.3 (kept)
    out = off_policy_mask(adv, logp, old, mask, threshold=0.3)
    assert torch.equal(out, t([1.0], [0.0], [1.0]))
    assert torch.equal(off_policy_mask(adv, logp, old, mask, threshold=0.5), t([1.0], [1.0], [1.0]))  # 0.5 <= 0.5


# ---------------------------------------------------------------------------
# 4. aggregation and the entropy bonus
# ---------------------------------------------------------------------------

PER_TOKEN = t([1.0, 2.0, 3.0], [4.0, math.nan, math.inf])  # NaN and inf sit at padded positions
MASK = t([1, 1, 1], [1, 0, 0])


@pytest.mark.parametrize(
    "loss_type, kwargs, expected",
    [
        ("grpo", {}, (2.0 + 4.0) / 2),  # the mean over sequences of each one's token mean
        ("sapo", {}, 3.0),
        ("bnpo", {}, 10.0 / 4),  # token sum / this batch's tokens
        ("dapo", {}, 10.0 / 4),
        ("cispo", {}, 10.0 / 4),
        ("vespo", {}, 10.0 / 4),
        ("dapo", {"num_items_in_batch": 8}, 10.0 / 8),  # / the whole update's tokens
        ("dr_grpo", {}, 10.0 / (2 * 3)),  # / (N * the completion width)
        ("dr_grpo", {"max_completion_length": 5}, 10.0 / (2 * 5)),
        ("luspo", {}, (6.0 + 4.0) / 2),  # the mean over sequences of each one's token sum
        ("grpo", {"gradient_accumulation_steps": 2}, 3.0 / 2),
        ("bnpo", {"gradient_accumulation_steps": 2}, 2.5 / 2),
        ("dr_grpo", {"gradient_accumulation_steps": 2}, 10.0 / 6 / 2),
        ("luspo", {"gradient_accumulation_steps": 2}, 5.0 / 2),
        ("dapo", {"gradient_accumulation_steps": 2, "num_items_in_batch": 8}, 10.0 / 8),  # K does not divide it
    ],
)
def test_aggregate_tokens_exact(loss_type, kwargs, expected):
    kwargs = dict(kwargs)
    length = kwargs.pop("max_completion_length", None)
    got = aggregate_tokens(PER_TOKEN, MASK, loss_type, length, **kwargs)
    assert got.item() == pytest.approx(expected, rel=1e-15)


def test_aggregate_tokens_refusals():
    with pytest.raises(ValueError, match="max_completion_length must be an int >= 3, got 2; it must cover the completion "
                                         "width, 3 tokens"):
        aggregate_tokens(PER_TOKEN, MASK, "dr_grpo", 2)
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be an int >= 1, got 0"):
        aggregate_tokens(PER_TOKEN, MASK, "grpo", gradient_accumulation_steps=0)
    with pytest.raises(ValueError, match="loss_type must be one of"):
        aggregate_tokens(PER_TOKEN, MASK, "mean")


def test_entropy_bonus_is_the_token_mean_over_the_mask():
    assert entropy_bonus(PER_TOKEN, MASK).item() == pytest.approx(10.0 / 4, rel=1e-15)
    assert entropy_bonus(PER_TOKEN, MASK, gradient_accumulation_steps=2).item() == pytest.approx(10.0 / 8, rel=1e-15)
    assert entropy_bonus(PER_TOKEN, torch.zeros_like(MASK)).item() == 0.0  # no tokens: 0, not 0 / 0


def test_applied_entropy_coef_is_the_gate():
    assert applied_entropy_coef(0.1, math.inf, 0.2) == 0.0  # no entropy measured yet
    assert applied_entropy_coef(0.1, 0.2, 0.2) == 0.1  # at the target: on
    assert applied_entropy_coef(0.1, 0.3, 0.2) == 0.0


def test_adapt_entropy_coef_moves_by_delta_within_bounds():
    step = dict(target=0.2, delta=0.05, coef_min=0.0, coef_max=1.0)
    assert adapt_entropy_coef(0.1, 0.1, **step) == pytest.approx(0.15)  # low entropy: more bonus
    assert adapt_entropy_coef(0.1, 0.2, **step) == pytest.approx(0.15)  # at the target counts as low
    assert adapt_entropy_coef(0.1, 0.3, **step) == pytest.approx(0.05)
    assert adapt_entropy_coef(0.98, 0.1, **step) == 1.0
    assert adapt_entropy_coef(0.01, 0.3, **step) == 0.0


@dataclasses.dataclass(frozen=True)
class Options:
    entropy_coef: float = 0.0
    loss_type: str = "grpo"


def test_entropy_control_adaptive_run():
    config = SimpleNamespace(entropy_coef=0.1, use_adaptive_entropy=True, entropy_target=0.2, entropy_coef_delta=0.05,
                             entropy_coef_min=0.0, entropy_coef_max=1.0)
    control = EntropyControl.from_config(config)
    assert control.to_meta() == {"coef": 0.1, "last_entropy": None}
    assert control.loss_options(Options(entropy_coef=0.1)) == Options(entropy_coef=0.0)  # nothing measured: off
    # two micro-batches: (3 + 1) / (10 + 10) = 0.2 nats, at the target: the coefficient rises by delta
    control.measured([{"entropy_sum": 3.0, "entropy_tokens": 10.0}, {"entropy_sum": 1.0, "entropy_tokens": 10.0}])
    assert control.last_entropy == pytest.approx(0.2) and control.coef == pytest.approx(0.15)
    assert control.loss_options(Options()) == Options(entropy_coef=control.coef)
    control.measured([{"entropy_sum": 5.0, "entropy_tokens": 10.0}])  # 0.5 > 0.2: falls back
    assert control.coef == pytest.approx(0.10) and control.loss_options(Options()) == Options(entropy_coef=0.0)
    resumed = EntropyControl.from_config(config, saved=control.to_meta())
    assert (resumed.coef, resumed.last_entropy) == (control.coef, control.last_entropy)


def test_entropy_control_fixed_changes_nothing():
    config = SimpleNamespace(entropy_coef=0.03, use_adaptive_entropy=False, entropy_target=0.2, entropy_coef_delta=0.05,
                             entropy_coef_min=0.0, entropy_coef_max=1.0)
    control = EntropyControl.from_config(config)
    options = Options(entropy_coef=0.03)
    assert control.loss_options(options) is options
    control.measured([{"entropy_sum": 0.0, "entropy_tokens": 10.0}])
    assert control.coef == 0.03 and math.isinf(control.last_entropy)
