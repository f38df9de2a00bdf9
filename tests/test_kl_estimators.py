"""Chapter 5's estimator tools: exact KLs, estimator statistics, penalty gradients."""

import math

import pytest
import torch

from grpo_tutorial import kl_estimate
from grpo_tutorial.chapters.kl_estimators import (
    PENALTY_FORMS,
    categorical_kl,
    estimator_stats,
    expected_penalty_grad,
    gaussian_kl,
    kl_regularized_optimum,
)


def test_gaussian_kl_exact_values():
    # Schulman's two cases: KL(N(0,1) || N(mu,1)) = mu^2 / 2
    assert gaussian_kl(0.0, 1.0, 0.1, 1.0).item() == pytest.approx(0.005, rel=1e-12)
    assert gaussian_kl(0.0, 1.0, 1.0, 1.0).item() == pytest.approx(0.5, rel=1e-12)
    # different widths: log 2 + 1/8 - 1/2
    assert gaussian_kl(0.0, 1.0, 0.0, 2.0).item() == pytest.approx(math.log(2) + 0.125 - 0.5, rel=1e-12)
    assert gaussian_kl(0.3, 0.7, 0.3, 0.7).item() == 0.0


def test_gaussian_kl_matches_torch_distributions_and_broadcasts():
    g = torch.Generator().manual_seed(3)
    mq, mp = torch.randn(5, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)
    sq = torch.rand(5, generator=g, dtype=torch.float64) + 0.2
    sp = torch.rand(5, generator=g, dtype=torch.float64) + 0.2
    Normal = torch.distributions.Normal
    expected = torch.distributions.kl_divergence(Normal(mq, sq), Normal(mp, sp))  # [5]
    torch.testing.assert_close(gaussian_kl(mq, sq, mp, sp), expected)
    assert gaussian_kl(0.0, 1.0, mp, 1.0).shape == (5,)


def test_gaussian_kl_rejects_bad_sigma():
    with pytest.raises(ValueError, match="sigma_q must be > 0"):
        gaussian_kl(0.0, 0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="sigma_p must be > 0"):
        gaussian_kl(0.0, 1.0, 0.0, torch.tensor([1.0, -1.0]))


def test_categorical_kl_hand_example():
    logp = torch.tensor([0.5, 0.5]).log()
    ref = torch.tensor([0.25, 0.75]).log()
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert categorical_kl(logp, ref).item() == pytest.approx(expected, rel=1e-6)
    assert categorical_kl(ref, ref).item() == pytest.approx(0.0, abs=1e-7)


def test_categorical_kl_zero_probabilities():
    # pi never picks token 1: it contributes 0, and the gradient stays finite
    logits = torch.tensor([0.0, -float("inf")], requires_grad=True)
    logp = torch.log_softmax(logits, dim=-1)
    ref = torch.tensor([0.5, 0.5]).log()
    kl = categorical_kl(logp, ref)
    assert kl.item() == pytest.approx(math.log(2))
    kl.backward()
    assert torch.isfinite(logits.grad).all()
    # pi puts mass where pi_ref has none: infinite KL
    assert categorical_kl(ref, torch.tensor([1.0, 0.0]).log()).item() == float("inf")


def test_categorical_kl_batched_matches_torch_distributions():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(2, 3, 7, generator=g, dtype=torch.float64)  # [N, T, V]
    b = torch.randn(2, 3, 7, generator=g, dtype=torch.float64)
    ours = categorical_kl(a.log_softmax(-1), b.log_softmax(-1))  # [N, T]
    Cat = torch.distributions.Categorical
    torch.testing.assert_close(ours, torch.distributions.kl_divergence(Cat(logits=a), Cat(logits=b)))
    # the vocabulary may sit on another dimension
    ours_dim1 = categorical_kl(a.log_softmax(-1).transpose(1, 2), b.log_softmax(-1).transpose(1, 2), dim=1)
    torch.testing.assert_close(ours_dim1, ours)


def test_categorical_kl_rejects_logits_and_mismatches():
    with pytest.raises(ValueError, match="log_softmax"):
        categorical_kl(torch.tensor([2.0, 1.0]), torch.tensor([0.5, 0.5]).log())
    with pytest.raises(ValueError, match="ref_logp must hold log-probabilities"):
        categorical_kl(torch.tensor([0.5, 0.5]).log(), torch.tensor([0.0, 0.0]))
    with pytest.raises(ValueError, match="shape"):
        categorical_kl(torch.zeros(2, 3).log_softmax(-1), torch.zeros(3, 2).log_softmax(-1))
    with pytest.raises(TypeError, match="logp must be a torch.Tensor"):
        categorical_kl([0.5, 0.5], torch.zeros(2))


def test_estimator_stats_on_two_samples():
    logp = torch.tensor([-1.0, -2.0], dtype=torch.float64)
    ref = torch.tensor([-1.5, -1.5], dtype=torch.float64)
    s = estimator_stats(logp, ref, true_kl=0.1)
    # k1 = logp - ref = [0.5, -0.5]: mean 0, sample std sqrt(0.5)
    assert s["k1"]["mean"] == pytest.approx(0.0, abs=1e-15)
    assert s["k1"]["std"] == pytest.approx(math.sqrt(0.5))
    assert s["k1"]["stderr"] == pytest.approx(math.sqrt(0.5) / math.sqrt(2))
    assert s["k1"]["rel_bias"] == pytest.approx(-1.0)
    assert s["k1"]["rel_std"] == pytest.approx(math.sqrt(0.5) / 0.1)
    # k2 = [0.125, 0.125]: no spread
    assert s["k2"]["mean"] == pytest.approx(0.125)
    assert s["k2"]["std"] == pytest.approx(0.0, abs=1e-15)
    assert s["k2"]["bias"] == pytest.approx(0.025)
    k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(0.5) - 0.5 - 1]
    assert s["k3"]["mean"] == pytest.approx(sum(k3) / 2)
    assert set(estimator_stats(logp, ref, 0.1, kinds=("k3",))) == {"k3"}


def test_estimator_stats_reproduces_gaussian_closed_forms():
    # q = N(0,1) samples, p = N(mu,1): log r = mu x - mu^2/2, so
    # k1 has std mu; k2 has mean mu^2/2 + mu^4/8 (relative bias mu^2/4) and
    # variance mu^4/2 + mu^6/4; k3 has variance exp(mu^2) - 1 - mu^2.
    mu, n = 0.5, 400_000
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    logq = -0.5 * x**2
    logp = -0.5 * (x - mu) ** 2  # the shared -log(sqrt(2 pi)) cancels in every estimator
    true = gaussian_kl(0.0, 1.0, mu, 1.0).item()
    s = estimator_stats(logq, logp, true)
    for kind, rel_bias in [("k1", 0.0), ("k2", mu**2 / 4), ("k3", 0.0)]:
        assert abs(s[kind]["rel_bias"] - rel_bias) < 4 * s[kind]["stderr"] / true
    exact_std = {"k1": mu, "k2": math.sqrt(mu**4 / 2 + mu**6 / 4), "k3": math.sqrt(math.exp(mu**2) - 1 - mu**2)}
    for kind, std in exact_std.items():
        assert s[kind]["std"] == pytest.approx(std, rel=0.02)
    # the ordering Schulman reports: k1 is by far the noisiest
    assert s["k1"]["rel_std"] > 2 * s["k3"]["rel_std"]


def test_estimator_stats_bad_input():
    x = torch.zeros(4)
    with pytest.raises(ValueError, match="true_kl must be a finite number > 0"):
        estimator_stats(x, x, 0.0)
    with pytest.raises(TypeError, match="true_kl must be a float"):
        estimator_stats(x, x, torch.tensor(0.1))
    with pytest.raises(ValueError, match="kinds must be a non-empty tuple"):
        estimator_stats(x, x, 0.1, kinds="k1")
    with pytest.raises(ValueError, match="kinds entry must be one of"):
        estimator_stats(x, x, 0.1, kinds=("k4",))
    with pytest.raises(ValueError, match="at least 2 samples"):
        estimator_stats(torch.zeros(1), torch.zeros(1), 0.1)
    with pytest.raises(ValueError, match="shape"):
        estimator_stats(torch.zeros(3), torch.zeros(4), 0.1)


def _reverse_and_forward_kl_grads(z, ref):
    zr = z.clone().requires_grad_()
    (rev,) = torch.autograd.grad(categorical_kl(torch.log_softmax(zr, -1), ref).sum(), zr)
    zf = z.clone().requires_grad_()
    (fwd,) = torch.autograd.grad(categorical_kl(ref, torch.log_softmax(zf, -1)).sum(), zf)
    return rev, fwd


@pytest.mark.parametrize("seed", [0, 1])
def test_expected_penalty_grad_matches_the_kl_it_optimises(seed):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(3, 6, generator=g, dtype=torch.float64)  # [N, V] policy logits
    ref = torch.randn(3, 6, generator=g, dtype=torch.float64).log_softmax(-1)  # [N, V]
    rev, fwd = _reverse_and_forward_kl_grads(z, ref)
    assert (rev - fwd).abs().max() > 1e-2  # the two targets really differ here
    torch.testing.assert_close(expected_penalty_grad(z, ref, "k1"), torch.zeros_like(z), atol=1e-12, rtol=0)
    torch.testing.assert_close(expected_penalty_grad(z, ref, "k2"), rev)
    torch.testing.assert_close(expected_penalty_grad(z, ref, "k3"), fwd)  # k3 in the loss: KL(ref || pi)
    torch.testing.assert_close(expected_penalty_grad(z, ref, "k3_ratio"), rev)
    torch.testing.assert_close(expected_penalty_grad(z, ref, "k1_reward"), rev)


def test_expected_penalty_grad_equals_the_average_sampled_gradient():
    # Sample tokens from pi, put k3 of those tokens in a loss, backprop: on average the
    # gradient is what expected_penalty_grad computes by enumeration.
    g = torch.Generator().manual_seed(5)
    z = torch.randn(5, generator=g, dtype=torch.float64)
    ref = torch.randn(5, generator=g, dtype=torch.float64).log_softmax(-1)
    x = torch.multinomial(z.softmax(-1), 200_000, replacement=True, generator=g)  # sampled token ids
    zs = z.clone().requires_grad_()
    logp = torch.log_softmax(zs, -1)[x]  # [n]
    kl_estimate(logp, ref[x], "k3").mean().backward()
    exact = expected_penalty_grad(z, ref, "k3")
    assert (zs.grad - exact).abs().max().item() < 0.01
    assert exact.abs().max().item() > 0.05  # not trivially zero


def test_expected_penalty_grad_bad_input():
    z, ref = torch.zeros(3), torch.zeros(3).log_softmax(-1)
    with pytest.raises(ValueError, match="form must be one of"):
        expected_penalty_grad(z, ref, "k4")
    with pytest.raises(ValueError, match="ref_logp must hold log-probabilities"):
        expected_penalty_grad(z, torch.zeros(3), "k3")
    with pytest.raises(ValueError, match="shape"):
        expected_penalty_grad(torch.zeros(4), ref, "k3")
    assert PENALTY_FORMS == ("k1", "k2", "k3", "k3_ratio", "k1_reward")


def test_kl_regularized_optimum_hand_example():
    ref = torch.tensor([0.5, 0.5], dtype=torch.float64).log()
    r = torch.tensor([1.0, 0.0], dtype=torch.float64)
    pi = kl_regularized_optimum(ref, r, beta=1.0).exp()
    e = math.e
    torch.testing.assert_close(pi, torch.tensor([e / (e + 1), 1 / (e + 1)], dtype=torch.float64))
    # a huge beta keeps the reference, a tiny one puts everything on the best answer
    torch.testing.assert_close(kl_regularized_optimum(ref, r, 1e9).exp(), ref.exp())
    assert kl_regularized_optimum(ref, r, 1e-3).exp()[0].item() == pytest.approx(1.0)


def test_kl_regularized_optimum_is_the_maximiser():
    g = torch.Generator().manual_seed(2)
    ref = torch.randn(6, generator=g, dtype=torch.float64).log_softmax(-1)
    r = torch.rand(6, generator=g, dtype=torch.float64)
    beta = 0.3

    def objective(logp):
        return (logp.exp() * r).sum() - beta * categorical_kl(logp, ref)

    best = kl_regularized_optimum(ref, r, beta)
    z = best.clone().requires_grad_()
    (grad,) = torch.autograd.grad(objective(torch.log_softmax(z, -1)), z)
    torch.testing.assert_close(grad, torch.zeros_like(grad), atol=1e-12, rtol=0)  # a stationary point
    for _ in range(20):  # and no nearby policy scores higher (the objective is concave)
        other = (best + 0.3 * torch.randn(6, generator=g, dtype=torch.float64)).log_softmax(-1)
        assert objective(other) < objective(best)


def test_kl_regularized_optimum_bad_input():
    ref, r = torch.zeros(2).log_softmax(-1), torch.zeros(2)
    for bad in (0.0, -1.0, float("inf"), True):
        with pytest.raises(ValueError, match="beta must be a finite number > 0"):
            kl_regularized_optimum(ref, r, bad)
    with pytest.raises(ValueError, match="shape"):
        kl_regularized_optimum(ref, torch.zeros(3), 0.1)
    with pytest.raises(ValueError, match="log_softmax"):
        kl_regularized_optimum(torch.zeros(2), r, 0.1)
