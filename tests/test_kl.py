"""Stage 5: Schulman's k1, k2, k3 estimators of KL(pi_theta || pi_ref)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_tutorial import kl_estimate


def test_formulas_on_one_token():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-1.5])
    log_r = -0.5
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(-log_r)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * log_r**2)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(math.exp(log_r) - log_r - 1)


def test_equal_policies_give_zero():
    x = torch.randn(4, 5)
    for kind in ("k1", "k2", "k3"):
        assert torch.equal(kl_estimate(x, x, kind), torch.zeros(4, 5))


@settings(max_examples=200, deadline=None)
@given(st.floats(-30, 0), st.floats(-30, 0))
def test_k3_and_k2_are_never_negative(logp, ref):
    t, r = torch.tensor([logp], dtype=torch.float64), torch.tensor([ref], dtype=torch.float64)
    assert kl_estimate(t, r, "k3").item() >= 0
    assert kl_estimate(t, r, "k2").item() >= 0
    t32, r32 = t.float(), r.float()
    assert kl_estimate(t32, r32, "k3").item() >= 0


def _categoricals(seed, V=6):
    g = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64), 0)  # pi_theta, samples come from it
    p = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64), 0)  # pi_ref
    return q, p


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k1_and_k3_are_unbiased_in_exact_expectation(seed):
    q, p = _categoricals(seed)
    exact = (q * (q.log() - p.log())).sum()
    for kind in ("k1", "k3"):
        expectation = (q * kl_estimate(q.log(), p.log(), kind)).sum()
        assert expectation.item() == pytest.approx(exact.item(), rel=1e-10)
    k2 = (q * kl_estimate(q.log(), p.log(), "k2")).sum()
    assert abs(k2.item() - exact.item()) > 1e-4  # k2 is biased


def test_monte_carlo_mean_of_k3_matches_exact_kl():
    q, p = _categoricals(7)
    exact = (q * (q.log() - p.log())).sum().item()
    g = torch.Generator().manual_seed(0)
    x = torch.multinomial(q, 200_000, replacement=True, generator=g)
    k3 = kl_estimate(q.log()[x], p.log()[x], "k3")
    stderr = k3.std().item() / math.sqrt(len(x))
    assert abs(k3.mean().item() - exact) < 4 * stderr


def test_k3_gradient_matches_hand_derivation():
    logp = torch.tensor([-0.5, -2.0, -1.0], requires_grad=True)
    ref = torch.tensor([-0.7, -1.0, -1.0])
    kl_estimate(logp, ref, "k3").sum().backward()
    # d/dlogp [exp(ref - logp) - (ref - logp) - 1] = 1 - exp(ref - logp)
    torch.testing.assert_close(logp.grad, 1 - torch.exp(ref - logp.detach()))


def test_bad_input():
    with pytest.raises(ValueError, match="kind must be one of"):
        kl_estimate(torch.zeros(2), torch.zeros(2), "k4")
    with pytest.raises(ValueError, match="shape"):
        kl_estimate(torch.zeros(2, 3), torch.zeros(3, 2))
    with pytest.raises(TypeError, match="ref_logp must be a torch.Tensor"):
        kl_estimate(torch.zeros(2), [0.0, 0.0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_expected_k3_gradient_is_the_forward_kl_gradient_and_the_ratio_weighted_one_the_reverse(seed):
    """Exact expectations over a small categorical, with theta its logits (issue 24, chapter 5).

    E_{x~pi}[grad k3(x)] = grad KL(pi_ref || pi): plain k3 used as a loss pulls towards the
    *forward* KL. With DeepSeek-V3.2's correction, ratio * k3 where ratio = pi / pi_old is not
    detached (on-policy: pi_old = pi, value 1), E[grad(ratio * k3)] = grad KL(pi || pi_ref),
    the reverse KL the penalty is meant to keep small.
    """
    from grpo_tutorial.objectives import importance_weighted_kl

    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.randn(6, generator=g, dtype=torch.float64), dim=0)
    logp = torch.log_softmax(theta, dim=0)  # [V], log pi(x) for every x
    weights = logp.exp().detach()  # sampling probabilities: the expectation is a weighted sum
    k3 = kl_estimate(logp, ref, "k3")  # [V]
    ratio = torch.exp(logp - logp.detach())  # [V], value 1, gradient grad log pi
    (plain,) = torch.autograd.grad((weights * k3).sum(), theta, retain_graph=True)
    (corrected,) = torch.autograd.grad((weights * importance_weighted_kl(k3, ratio)).sum(), theta, retain_graph=True)
    (forward,) = torch.autograd.grad((ref.exp() * (ref - logp)).sum(), theta, retain_graph=True)
    (reverse,) = torch.autograd.grad((logp.exp() * (logp - ref)).sum(), theta)
    torch.testing.assert_close(plain, forward, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(corrected, reverse, atol=1e-12, rtol=1e-10)
    assert (forward - reverse).abs().max() > 1e-2  # the two KLs pull differently here
    # and the per-token coefficient on grad log pi, on-policy, is log(pi / pi_ref) (k1)
    single = logp[2:3].detach().clone().requires_grad_(True)
    term = importance_weighted_kl(kl_estimate(single, ref[2:3]), torch.exp(single - single.detach()))
    (coef,) = torch.autograd.grad(term.sum(), single)
    torch.testing.assert_close(coef, single.detach() - ref[2:3], atol=1e-12, rtol=1e-10)
