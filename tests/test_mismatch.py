"""Issue 35, stage A: a sampler that is not the learner, and TRL's importance-sampling correction.

Three parts:

* :func:`~grpo_tutorial.mismatch.sampler_weights` and the logged log-prob
  differences against TRL 1.16's own code. TRL has no function for either: both
  are inline in ``GRPOTrainer._generate_and_score_completions``. The test lifts
  those blocks from TRL's source with ``inspect.getsource`` (found by their text,
  dedented) and ``exec``s them on the same float64 tensors, with a stand-in
  ``self`` holding the attributes they read; never a retyped copy. The two agree
  to 1e-12 in all four modes, with NaN sampler log-probs and a missing bound.
* the diagnostics on hand-made numbers, and the weights' way into ``grpo_loss``.
* the sampler copies on the tiny model, a few steps each: the bfloat16 copy equals
  the policy cast after every sync, the stale copy lags exactly k updates, the top-p
  sampler samples from the nucleus and reports its log-probs; the default sampler
  changes nothing (the golden runs, ``tests/test_golden.py``, hold that bit for bit).
"""

from __future__ import annotations

import inspect
import math
import textwrap
import warnings
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

import grpo_tutorial.step as step_module
from grpo_tutorial import GRPOConfig, GRPOTrainer, GRPOWarning, make_arithmetic_dataset
from grpo_tutorial.logprobs import score_rollout
from grpo_tutorial.loss import grpo_loss
from grpo_tutorial.mismatch import IS_MODES, mismatch_diagnostics, sampler_weights
from grpo_tutorial.rollout import concat_groups
from grpo_tutorial.sampling import PolicySampler, SamplerCopy, build_sampler, top_p_logprobs

import helpers
from helpers import small_model

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")

DTYPE = torch.float64
N, T = 8, 6


# ---------------------------------------------------------------------------
# TRL's own code, lifted from its source
# ---------------------------------------------------------------------------


def trl_block(first: str, stop: str) -> str:
    """The lines of ``_generate_and_score_completions`` from the line that is ``first`` (stripped) up to, not
    including, the next line that starts with ``stop`` (stripped), dedented."""
    lines = inspect.getsource(trl_grpo.GRPOTrainer._generate_and_score_completions).splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == first]
    assert len(starts) >= 1, f"TRL's source no longer has the line {first!r}"
    for start in starts:
        ends = [j for j in range(start + 1, len(lines)) if lines[j].strip().startswith(stop)]
        if ends:
            return textwrap.dedent("\n".join(lines[start : ends[0]]))
    raise AssertionError(f"TRL's source has no {stop!r} after {first!r}")


#: TRL's importance-sampling ratio: from the vLLM correction's ``if`` to the reference model's scoring.
WEIGHTS_BLOCK = ("if self.use_vllm and self.vllm_importance_sampling_correction:",
                 "# Compute the per-token log probabilities for the reference model")
#: TRL's logged metrics of the correction: from the second such ``if`` to the output dict.
METRICS_BLOCK = ("if self.use_vllm and self.vllm_importance_sampling_correction:", "output = {")


def run_trl(logp, sampler_logp, mask, mode, clip_min, clip_max, tool_mask=None) -> dict:
    """Both TRL blocks on these tensors; returns the namespace they ran in (``vllm_importance_sampling_ratio``, ...)."""
    weights_code = trl_block(*WEIGHTS_BLOCK)
    assert "vllm_importance_sampling_ratio = torch.exp(logps_diff)" in weights_code  # the block we mean
    lines = inspect.getsource(trl_grpo.GRPOTrainer._generate_and_score_completions).splitlines()
    second = [i for i, line in enumerate(lines) if line.strip() == METRICS_BLOCK[0]][1]  # the second such `if`
    end = next(j for j in range(second, len(lines)) if lines[j].strip().startswith(METRICS_BLOCK[1]))
    metrics_code = textwrap.dedent("\n".join(lines[second:end]))
    assert "sampling/sampling_logp_difference/mean" in metrics_code
    one_process = SimpleNamespace(gather=lambda t: t)
    self = SimpleNamespace(
        use_vllm=True, vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=mode,
        vllm_importance_sampling_clip_min=clip_min, vllm_importance_sampling_clip_max=clip_max,
        accelerator=one_process, _metrics={"train": defaultdict(list)},
    )
    namespace = dict(vars(trl_grpo))  # TRL's module globals: torch, math, nanmin, nanmax, ...
    namespace.update(self=self, old_per_token_logps=logp, sampling_per_token_logps=sampler_logp,
                     completion_mask=mask, tool_mask=tool_mask, mode="train", device=logp.device)
    exec(compile(weights_code, "trl-weights", "exec"), namespace)
    exec(compile(metrics_code, "trl-metrics", "exec"), namespace)
    namespace["logged"] = {k: v[0] for k, v in self._metrics["train"].items()}
    return namespace


def mismatched(seed: int = 0, spread: float = 0.6, nan_tokens: bool = True):
    """Trainer and sampler log-probs far enough apart that every bound bites; ragged lengths; NaN where asked."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(N, T, generator=g, dtype=DTYPE) * 3 - 0.05  # [N, T]
    sampler = logp + spread * torch.randn(N, T, generator=g, dtype=DTYPE)  # [N, T]
    lengths = torch.tensor([6, 1, 3, 5, 2, 6, 4, 3])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(DTYPE)  # [N, T]
    sampler = torch.where(mask.bool(), sampler, torch.full_like(sampler, 0.0))  # padding: 0 (TRL pads with 0)
    sampler[5] = logp[5] - 0.4  # one completion far more likely under the trainer: sequence ratio e^2.4
    sampler[3, 5] = math.nan  # a padded position may hold anything
    if nan_tokens:
        sampler[0, 2] = math.nan  # real tokens the engine could not score
        sampler[6, 0] = math.nan
    return logp, sampler, mask


BOUNDS = [(None, 3.0), (0.5, 2.0), (0.7, None), (0.0, 1.5)]


@pytest.mark.parametrize("clip_min, clip_max", BOUNDS, ids=[f"{a}-{b}" for a, b in BOUNDS])
@pytest.mark.parametrize("mode", IS_MODES)
def test_weights_agree_with_trls_own_code_in_every_mode(mode, clip_min, clip_max):
    logp, sampler, mask = mismatched()
    theirs = run_trl(logp, sampler, mask, mode, clip_min, clip_max)["vllm_importance_sampling_ratio"]
    ours = sampler_weights(logp, sampler, mask, mode, clip_min, clip_max)
    assert ours.shape == theirs.shape == ((N, 1) if mode.startswith("sequence") else (N, T))
    assert ours.dtype == DTYPE
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=0)
    assert torch.isfinite(ours).all()
    # the bounds act on these tensors (otherwise the comparison would not test them)
    real = ours if mode.startswith("sequence") else ours[mask.bool()]
    raw = sampler_weights(logp, sampler, mask, mode.split("_")[0] + "_mask", None, None)
    raw = raw if mode.startswith("sequence") else raw[mask.bool()]
    assert not torch.equal(real, raw)


@pytest.mark.parametrize("mode", IS_MODES)
def test_nan_sampler_logprobs_count_as_ratio_one_as_in_trl(mode):
    logp, sampler, mask = mismatched()
    ours = sampler_weights(logp, sampler, mask, mode, None, None if mode.endswith("mask") else 100.0)
    theirs = run_trl(logp, sampler, mask, mode, None, None if mode.endswith("mask") else 100.0)
    torch.testing.assert_close(ours, theirs["vllm_importance_sampling_ratio"], atol=1e-12, rtol=0)
    if mode.startswith("token"):
        assert ours[0, 2] == ours[6, 0] == 1.0  # NaN: no correction on that token
        assert ours[1, 3] == 1.0  # padding: ratio 1 (the loss's mask drops it anyway)
    else:  # the sequence ratio is the product of the other tokens' ratios
        known = torch.nan_to_num((logp - sampler) * mask, nan=0.0)[6].sum()
        assert ours[6, 0].item() == pytest.approx(math.exp(known.item()), rel=1e-12)
    assert torch.isfinite(ours).all()


def test_logged_logp_differences_agree_with_trl():
    """``mismatch/logp_diff_mean`` and ``max`` are TRL's ``sampling/sampling_logp_difference/mean`` and ``max``."""
    for nan_tokens in (False, True):
        logp, sampler, mask = mismatched(seed=3, nan_tokens=nan_tokens)
        logged = run_trl(logp, sampler, mask, "sequence_mask", None, 3.0)["logged"]
        ours = mismatch_diagnostics(logp, sampler, mask, None, 3.0)
        assert ours["mismatch/logp_diff_mean"] == pytest.approx(logged["sampling/sampling_logp_difference/mean"],
                                                                abs=1e-12)
        assert ours["mismatch/logp_diff_max"] == pytest.approx(logged["sampling/sampling_logp_difference/max"],
                                                               abs=1e-12)


@pytest.mark.parametrize("mode", IS_MODES)
def test_with_tools_the_correction_reads_the_sampled_tokens_as_trls_own_code_does(mode):
    """A tool's tokens were sampled by nobody: TRL gives them a sampling log-prob of 0.0 and computes the ratio and
    its logged differences over ``completion_mask * tool_mask``; sampler_correction, over ``rollout.loss_mask``."""
    from grpo_tutorial.mismatch import sampler_correction

    logp, sampler, mask = mismatched(seed=5, nan_tokens=False)
    tool_mask = torch.ones_like(mask)
    tool_mask[0, 1:3] = 0  # a tool's answer in the middle of three completions, and one at the end
    tool_mask[3, 2:4] = 0
    tool_mask[7, 1:] = 0
    sampler = torch.where(tool_mask.bool(), sampler, torch.zeros_like(sampler))  # 0.0 there, as TRL stores it
    config = SimpleNamespace(vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=mode,
                             vllm_importance_sampling_clip_min=0.5, vllm_importance_sampling_clip_max=2.0)
    rollout = SimpleNamespace(sampler_logprobs=sampler, sampler_stats=None, completion_mask=mask,
                              loss_mask=mask * tool_mask)
    weights, diagnostics = sampler_correction(logp, rollout, config)
    theirs = run_trl(logp, sampler, mask, mode, 0.5, 2.0, tool_mask=tool_mask)
    torch.testing.assert_close(weights, theirs["vllm_importance_sampling_ratio"], atol=1e-12, rtol=0)
    for ours_key, trl_key in (("mismatch/logp_diff_mean", "sampling/sampling_logp_difference/mean"),
                              ("mismatch/logp_diff_max", "sampling/sampling_logp_difference/max")):
        assert diagnostics[ours_key] == pytest.approx(theirs["logged"][trl_key], abs=1e-12)
    # the planted bug: the completion mask alone (the tool's tokens read as sampled) gives other weights
    wrong, _ = sampler_correction(logp, SimpleNamespace(**{**vars(rollout), "loss_mask": mask}), config)
    assert not torch.allclose(wrong, weights)


def test_a_truncate_mode_needs_a_bound_and_bad_inputs_are_refused():
    logp, sampler, mask = mismatched()
    with pytest.raises(ValueError, match=r"mode='token_truncate' needs clip_min or clip_max"):
        sampler_weights(logp, sampler, mask, "token_truncate", None, None)
    with pytest.raises(ValueError, match=r"^mode must be one of \['token_truncate', 'token_mask', "):
        sampler_weights(logp, sampler, mask, "token")
    with pytest.raises(ValueError, match=r"^clip_min must be less than clip_max = 2.0, got 2.0"):
        sampler_weights(logp, sampler, mask, "token_mask", 2.0, 2.0)
    with pytest.raises(ValueError, match="shape"):
        sampler_weights(logp, sampler[:, :3], mask)
    with pytest.raises(TypeError, match="sampler_logp must be a torch.Tensor"):
        mismatch_diagnostics(logp, sampler.tolist(), mask)


# ---------------------------------------------------------------------------
# The diagnostics, on numbers worked by hand
# ---------------------------------------------------------------------------


def test_diagnostics_on_hand_made_log_ratios():
    # log r = logp - sampler_logp: row 0 has (log 2, 0), row 1 has (-log 2, pad), row 2 has (0, 0)
    logp = torch.tensor([[math.log(2.0), 0.0], [-math.log(2.0), 0.0], [0.0, 0.0]], dtype=DTYPE) - 1.0
    sampler = torch.full((3, 2), -1.0, dtype=DTYPE)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]], dtype=DTYPE)
    d = mismatch_diagnostics(logp, sampler, mask, clip_min=0.6, clip_max=1.5)
    k3 = {2.0: 2.0 - 1 - math.log(2.0), 0.5: 0.5 - 1 + math.log(2.0)}  # r - 1 - log r
    assert d["mismatch/logp_diff_mean"] == pytest.approx(2 * math.log(2.0) / 5, abs=1e-12)
    assert d["mismatch/logp_diff_max"] == pytest.approx(math.log(2.0), abs=1e-12)
    assert d["mismatch/kl"] == pytest.approx((k3[2.0] + k3[0.5]) / 5, abs=1e-12)  # mean over the 5 real tokens
    assert d["mismatch/kl_sequence"] == pytest.approx((k3[2.0] + k3[0.5]) / 3, abs=1e-12)  # per-row sums, mean
    assert d["mismatch/token_outside"] == pytest.approx(2 / 5)  # ratios 2 and 0.5 lie outside [0.6, 1.5]
    assert d["mismatch/sequence_outside"] == pytest.approx(2 / 3)  # sequence ratios 2, 0.5, 1
    w = torch.tensor([2.0, 0.5, 1.0], dtype=DTYPE)
    assert d["mismatch/ess"] == pytest.approx(float(w.sum() ** 2 / (3 * (w**2).sum())), abs=1e-12)
    no_bounds = mismatch_diagnostics(logp, sampler, mask, None, None)
    assert no_bounds["mismatch/token_outside"] == no_bounds["mismatch/sequence_outside"] == 0.0


def test_ess_is_one_for_equal_weights_and_one_over_n_for_one_dominant_sequence():
    mask = torch.ones(4, 3, dtype=DTYPE)
    logp = torch.full((4, 3), -1.0, dtype=DTYPE)
    assert mismatch_diagnostics(logp, logp + 0.0, mask)["mismatch/ess"] == pytest.approx(1.0)
    assert mismatch_diagnostics(logp, logp - 0.3, mask)["mismatch/ess"] == pytest.approx(1.0)  # the scale is not seen
    dominant = logp.clone()
    dominant[0] += 40.0  # one sequence ratio e^120 times the others (no overflow: computed in log space)
    ess = mismatch_diagnostics(dominant, logp, mask)["mismatch/ess"]
    assert ess == pytest.approx(0.25, abs=1e-9)
    same = mismatch_diagnostics(logp, logp, mask)
    assert same["mismatch/kl"] == same["mismatch/logp_diff_max"] == same["mismatch/token_outside"] == 0.0


# ---------------------------------------------------------------------------
# The weights in the loss
# ---------------------------------------------------------------------------


def loss_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(N, T, generator=g, dtype=DTYPE) - 0.1
    logp = (old + 0.05 * torch.randn(N, T, generator=g, dtype=DTYPE)).requires_grad_(True)
    adv = torch.randn(N, generator=g, dtype=DTYPE)
    _, _, mask = mismatched()
    return logp, old, adv, mask


@pytest.mark.parametrize("mode", IS_MODES)
def test_the_loss_multiplies_each_tokens_policy_loss_by_its_weight(mode):
    logp, old, adv, mask = loss_inputs()
    weights = sampler_weights(old, *mismatched()[1:], mode, 0.5, 2.0)  # [N, T] or [N, 1]
    plain, _ = grpo_loss(logp, old, adv, mask, loss_type="dapo")
    weighted, _ = grpo_loss(logp, old, adv, mask, loss_type="dapo", sampler_weights=weights)
    (g_plain,) = torch.autograd.grad(plain, logp)
    (g_weighted,) = torch.autograd.grad(weighted, logp)
    # dapo is a sum over tokens / their count, so each token's gradient is scaled by its weight
    torch.testing.assert_close(g_weighted, g_plain * weights.expand(N, T), atol=1e-12, rtol=0)
    ones, _ = grpo_loss(logp, old, adv, mask, loss_type="dapo", sampler_weights=torch.ones(N, 1, dtype=DTYPE))
    assert torch.equal(ones, plain)  # weights of one change nothing, bit for bit


def test_the_loss_refuses_weights_of_the_wrong_shape():
    logp, old, adv, mask = loss_inputs()
    with pytest.raises(ValueError, match=r"sampler_weights must have shape \(8, 6\) or \(8, 1\), got \(8, 2\)"):
        grpo_loss(logp, old, adv, mask, sampler_weights=torch.ones(N, 2, dtype=DTYPE))
    with pytest.raises(TypeError, match="sampler_weights must be a torch.Tensor"):
        grpo_loss(logp, old, adv, mask, sampler_weights=[1.0] * N)


def test_vespo_folds_the_weights_into_its_sequence_weight():
    """VESPO's w becomes pi_theta(o) / mu(o): a sequence weight of c multiplies w by c (TRL's get_gamma_weights)."""
    from grpo_tutorial.objectives import vespo_weights

    logp, old, adv, mask = loss_inputs()
    log_ratio = ((logp.detach() - old) * mask)  # [N, T]
    c = torch.linspace(0.5, 2.0, N, dtype=DTYPE)[:, None]  # [N, 1]
    shifted = log_ratio.clone()
    shifted[:, 0] += torch.log(c[:, 0])  # the same log w, put into the first token's log-ratio
    a = adv[:, None]
    torch.testing.assert_close(vespo_weights(log_ratio, mask, a, sampler_weights=c), vespo_weights(shifted, mask, a),
                               atol=1e-12, rtol=0)
    ones = vespo_weights(log_ratio, mask, a, sampler_weights=torch.ones(N, T, dtype=DTYPE))
    assert torch.equal(ones, vespo_weights(log_ratio, mask, a))
    plain, _ = grpo_loss(logp, old, adv, mask, loss_type="vespo")
    folded, _ = grpo_loss(logp, old, adv, mask, loss_type="vespo", sampler_weights=c)
    assert abs(plain.item() - folded.item()) > 1e-6  # it acts, and not as a factor on the loss


# ---------------------------------------------------------------------------
# The config
# ---------------------------------------------------------------------------


def test_config_defaults_are_the_books_and_trls_names_and_bounds():
    cfg = GRPOConfig()
    assert (cfg.sampler, cfg.sampler_staleness) == ("policy", 1)
    assert cfg.vllm_importance_sampling_correction is False  # TRL's default is True: see the field's doc
    assert (cfg.vllm_importance_sampling_mode, cfg.vllm_importance_sampling_clip_min,
            cfg.vllm_importance_sampling_clip_max) == ("sequence_mask", None, 3.0)  # TRL's defaults
    trl_config = pytest.importorskip("trl").GRPOConfig
    import dataclasses

    trl_defaults = {f.name: f.default for f in dataclasses.fields(trl_config)}
    for name in ("vllm_importance_sampling_mode", "vllm_importance_sampling_clip_min",
                 "vllm_importance_sampling_clip_max"):
        assert getattr(cfg, name) == trl_defaults[name], name
    assert trl_defaults["vllm_importance_sampling_correction"] is True


def test_config_refuses_what_trl_refuses():
    with pytest.raises(ValueError, match=r"^GRPOConfig.vllm_importance_sampling_clip_min must be less than "
                                         r"vllm_importance_sampling_clip_max = 3.0, got 3.0$"):
        GRPOConfig(vllm_importance_sampling_clip_min=3.0)
    with pytest.raises(ValueError, match=r"^GRPOConfig.vllm_importance_sampling_clip_max must be a number with "
                                         r"vllm_importance_sampling_mode='token_truncate', got None"):
        GRPOConfig(vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="token_truncate",
                   vllm_importance_sampling_clip_max=None)
    GRPOConfig(vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="token_truncate",
               vllm_importance_sampling_clip_min=0.5, vllm_importance_sampling_clip_max=None)  # one bound is enough
    GRPOConfig(vllm_importance_sampling_correction=True, loss_type="vespo")  # TRL folds the weights into VESPO's


# ---------------------------------------------------------------------------
# The sampler copies, on the tiny model
# ---------------------------------------------------------------------------


def length_reward(completions, **kwargs):
    return [1.0 - min(len(c), 4) / 4 for c in completions]


def small_config(**kwargs) -> GRPOConfig:
    return helpers.small_config(**{**helpers.TWO_UPDATES, "max_new_tokens": 4, **kwargs})


def trainer_for(**kwargs) -> GRPOTrainer:
    model, tokenizer = small_model(seed=0)
    return GRPOTrainer(model, tokenizer, length_reward, small_config(**kwargs))


def train(trainer: GRPOTrainer, steps: int) -> list[dict]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GRPOWarning)
        return trainer.train(make_arithmetic_dataset(16, 0, digits=1), steps, progress=False)


def watch_syncs(trainer: GRPOTrainer, record) -> None:
    """Call ``record(sampler)`` after each of the sampler's syncs."""
    sampler = trainer.grpo_step.sampler
    sync = sampler.sync

    def synced():
        sync()
        record(sampler)

    sampler.sync = synced


def params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.state_dict().values()]


def test_the_bfloat16_copy_equals_the_policy_cast_after_every_sync():
    trainer = trainer_for(sampler="bfloat16")
    sampler = trainer.grpo_step.sampler
    assert isinstance(sampler, SamplerCopy) and sampler.model is not trainer.model
    assert all(p.dtype == torch.bfloat16 for p in sampler.model.parameters())
    assert all(not p.requires_grad for p in sampler.model.parameters())
    checks = []

    def same_as_policy_cast(s):
        policy = trainer.model.state_dict()
        checks.append(all(torch.equal(v, policy[k].to(torch.bfloat16)) for k, v in s.model.state_dict().items()))

    watch_syncs(trainer, same_as_policy_cast)
    start = params(trainer.model)
    history = train(trainer, 2)
    assert checks == [True] * 4  # 2 steps x 2 updates
    assert not all(torch.equal(a, b) for a, b in zip(start, params(trainer.model)))  # the policy did move
    row = history[-1]  # the copy's log-probs are close to the policy's, not equal (bfloat16 rounding)
    assert 0 < row["mismatch/logp_diff_mean"] < 0.05 and row["mismatch/kl"] >= 0
    assert {"mismatch/kl_sequence", "mismatch/token_outside", "mismatch/sequence_outside", "mismatch/ess"} <= set(row)
    assert "mismatch/weight_mean" not in row  # no correction: diagnostics only


def test_the_bfloat16_samplers_logprobs_are_the_copys_own():
    trainer = trainer_for(sampler="bfloat16")
    sampler = trainer.grpo_step.sampler
    rollout = sampler(["1+2=", "3+4="], 7)
    assert rollout.sampler_logprobs.shape == rollout.completion_mask.shape
    assert rollout.sampler_logprobs.dtype == torch.float32
    assert torch.equal(rollout.sampler_logprobs[rollout.completion_mask == 0],
                       torch.zeros(int((rollout.completion_mask == 0).sum())))
    own = score_rollout(sampler.model, rollout, temperature=1.0).float() * rollout.completion_mask
    assert torch.equal(rollout.sampler_logprobs, own)
    policy = score_rollout(trainer.model, rollout, temperature=1.0) * rollout.completion_mask
    gap = (policy - rollout.sampler_logprobs).abs().max()
    assert 0 < gap < 0.05


@pytest.mark.parametrize("k", [1, 3])
def test_the_stale_copy_lags_exactly_k_updates(k):
    trainer = trainer_for(sampler="stale", sampler_staleness=k)
    policy_after = [params(trainer.model)]  # policy_after[u]: the policy after u updates
    sampler_after = []

    def record(s):
        policy_after.append(params(trainer.model))
        sampler_after.append(params(s.model))

    watch_syncs(trainer, record)
    assert all(torch.equal(a, b) for a, b in zip(params(trainer.grpo_step.sampler.model), policy_after[0]))
    train(trainer, 3)  # 6 updates
    assert len(sampler_after) == 6
    for u, held in enumerate(sampler_after, start=1):
        expected = policy_after[max(u - k, 0)]
        assert all(torch.equal(a, b) for a, b in zip(held, expected)), (u, k)
        if u > k:
            assert not all(torch.equal(a, b) for a, b in zip(held, policy_after[u]))  # really stale
    assert len(trainer.grpo_step.sampler.snapshots) == k


def test_a_stale_sampler_is_measured_off_policy_and_the_default_is_not():
    stale = train(trainer_for(sampler="stale", sampler_staleness=2), 3)
    # Nothing stale yet: the copy holds the policy's weights, so the two log-probs differ only by float32
    # rounding (the learner scores with the shared-prompt cache, the copy with a full forward; on some CPUs
    # the two orders of summation give the same bits, on others not: 9e-15 of KL was seen on an AMD EPYC).
    # Each token's |log r| is then a few float32 ulps of a log-prob of a few nats, far under 1e-5, and k3
    # = r - 1 - log r <= (log r)^2 for |log r| < 1, so the KL is below 1e-10. A copy that is not the
    # policy (a snapshot one update late, random weights) is off by orders of magnitude more.
    first = stale[0]
    assert first["mismatch/logp_diff_max"] < 1e-5
    assert first["mismatch/kl"] <= first["mismatch/logp_diff_max"] ** 2 < 1e-10
    assert stale[-1]["mismatch/kl"] > 1e-4 and stale[-1]["mismatch/ess"] < 1.0
    default = trainer_for()
    assert type(default.grpo_step.sampler) is PolicySampler and default.grpo_step.sampler.is_learner
    history = train(default, 1)
    assert not [key for key in history[0] if key.startswith("mismatch/")]


def test_top_p_logprobs_are_the_renormalised_nucleus(small_policy):
    model, tokenizer = small_policy
    cfg = small_config()
    rollout = SamplerCopy(model, tokenizer, small_config(sampler="top_p", top_p=0.9), "top_p")(["1+2=", "3+4="], 3)
    full = score_rollout(model, rollout, temperature=cfg.temperature) * rollout.completion_mask
    whole = top_p_logprobs(model, rollout, temperature=1.0, top_p=1.0)
    torch.testing.assert_close(whole, full, atol=1e-5, rtol=0)  # the nucleus of p = 1 is everything
    nucleus = top_p_logprobs(model, rollout, temperature=1.0, top_p=0.9)
    torch.testing.assert_close(nucleus, rollout.sampler_logprobs, atol=0, rtol=0)
    assert (nucleus >= full - 1e-6).all()  # renormalised over less mass: pi / mu <= 1 for every token
    assert (nucleus > full + 1e-4).any()
    # the hand computation at one position: the most likely tokens up to 0.9 of the mass
    with torch.no_grad():
        logits = model(input_ids=rollout.input_ids[:1], attention_mask=rollout.attention_mask[:1]).logits
    tp = rollout.prompt_ids.shape[1]
    probs = torch.softmax(logits[0, tp - 1].double(), dim=-1)
    ordered, order = probs.sort(descending=True)
    keep = order[(ordered.cumsum(0) - ordered) < 0.9]
    token = int(rollout.completion_ids[0, 0])
    assert token in keep.tolist()
    expected = math.log(probs[token] / probs[keep].sum())
    assert nucleus[0, 0].item() == pytest.approx(expected, abs=1e-5)


def test_the_top_p_sampler_samples_from_the_nucleus():
    """With a nucleus so small that it holds one token, the sampler is greedy: every log-prob it reports is 0."""
    trainer = trainer_for(sampler="top_p", top_p=1e-6)
    sampler = trainer.grpo_step.sampler
    assert sampler.model is trainer.model  # no copy
    rollout = sampler(["1+2=", "3+4="], 11)
    real = rollout.completion_mask.bool()
    assert torch.equal(rollout.sampler_logprobs[real], torch.zeros(int(real.sum())))
    greedy = rollout.completion_ids[0::4]
    assert torch.equal(rollout.completion_ids, greedy.repeat_interleave(4, dim=0))  # all G completions alike
    history = train(trainer_for(sampler="top_p", top_p=0.7), 2)
    assert history[-1]["mismatch/logp_diff_mean"] > 0  # pi_old / mu < 1 on tokens whose nucleus is not everything


@pytest.mark.parametrize("mode", IS_MODES)
def test_the_correction_reaches_the_loss_in_every_mode(mode, monkeypatch):
    """The step passes :func:`sampler_weights` of stage 4's log-probs and the sampler's to every micro-batch."""
    seen = []
    real_loss = step_module.grpo_loss

    def recording(logp, old_logp, *args, sampler_weights=None, **kwargs):
        seen.append((old_logp.detach().clone(), sampler_weights))
        return real_loss(logp, old_logp, *args, sampler_weights=sampler_weights, **kwargs)

    monkeypatch.setattr(step_module, "grpo_loss", recording)
    corrections = []
    real_correction = step_module.sampler_correction

    def correction(old_logp, rollout, config):
        out = real_correction(old_logp, rollout, config)
        corrections.append((old_logp, rollout, out[0]))
        return out

    monkeypatch.setattr(step_module, "sampler_correction", correction)
    trainer = trainer_for(sampler="stale", sampler_staleness=1, vllm_importance_sampling_correction=True,
                          vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=0.9,
                          vllm_importance_sampling_clip_max=1.1, micro_batch_size=4)
    history = train(trainer, 3)
    assert len(corrections) == 3 and len(seen) == 3 * 4  # 2 updates x 2 micro-batches a step
    for old_logp, rollout, weights in corrections:
        expected = sampler_weights(old_logp, rollout.sampler_logprobs, rollout.completion_mask, mode, 0.9, 1.1)
        assert torch.equal(weights, expected)
    passed = [w for _, w in seen]
    assert all(w is not None and w.shape[0] == 4 for w in passed)
    assert all(w.shape[1] == (1 if mode.startswith("sequence") else T_of(corrections)) for w in passed)
    last = corrections[-1][2]
    assert not torch.all(last == 1.0)  # stale by one update, the bounds bite
    assert "mismatch/weight_mean" in history[-1]


def T_of(corrections) -> int:
    return corrections[0][1].completion_mask.shape[1]


def test_without_the_correction_no_weights_reach_the_loss_but_the_samplers_logprobs_do(monkeypatch):
    """The off-policy mask reads the sampler's log-probs whenever the rollout has them (TRL's does with vLLM)."""
    seen = []
    real_loss = step_module.grpo_loss

    def recording(*args, sampler_weights=None, sampler_logp=None, **kwargs):
        seen.append((sampler_weights, sampler_logp))
        return real_loss(*args, sampler_weights=sampler_weights, sampler_logp=sampler_logp, **kwargs)

    monkeypatch.setattr(step_module, "grpo_loss", recording)
    trainer = trainer_for(sampler="bfloat16", off_policy_mask_threshold=0.01)
    rollouts = []
    sampler = trainer.grpo_step.sampler
    trainer.grpo_step.sampler = lambda prompts, seed: rollouts.append(sampler(prompts, seed)) or rollouts[-1]
    trainer.grpo_step.sampler.sync = sampler.sync
    train(trainer, 1)
    assert [w for w, _ in seen] == [None] * 2
    rows = torch.cat([lp for _, lp in seen])  # the two updates' rows, shuffled
    assert rows.shape == rollouts[0].sampler_logprobs.shape
    assert sorted(rows.sum(dim=1).tolist()) == sorted(rollouts[0].sampler_logprobs.sum(dim=1).tolist())
    seen.clear()
    train(trainer_for(), 1)
    assert seen == [(None, None)] * 2


def test_the_sampler_is_chosen_one_way_and_the_correction_needs_sampler_logprobs(small_policy):
    model, tokenizer = small_policy
    with pytest.raises(ValueError, match=r"sampler= was given and GRPOConfig.sampler='bfloat16' too"):
        GRPOTrainer(model, tokenizer, length_reward, small_config(sampler="bfloat16"), sampler=lambda p, s: None)
    assert type(build_sampler(None, model, tokenizer, small_config())) is PolicySampler  # the policy as it is
    correcting = small_config(vllm_importance_sampling_correction=True)
    with pytest.raises(ValueError, match=r"vllm_importance_sampling_correction=True needs a sampler that is not the "
                                         r"learner: set GRPOConfig.sampler \('bfloat16', 'stale', 'top_p' or "
                                         r"'float16'\)"):
        GRPOTrainer(model, tokenizer, length_reward, correcting)
    copy = SamplerCopy(model, tokenizer, small_config(sampler="bfloat16"), "bfloat16")

    def without_logprobs(prompts, seed):  # a sampler of one's own that forgets its log-probs
        rollout = copy(prompts, seed)
        rollout.sampler_logprobs = None
        return rollout

    trainer = GRPOTrainer(model, tokenizer, length_reward, correcting, sampler=without_logprobs)
    with pytest.raises(ValueError, match="vllm_importance_sampling_correction=True, but the sampler gave no "
                                         "sampler_logprobs"):
        train(trainer, 1)
    history = train(GRPOTrainer(model, tokenizer, length_reward, correcting, sampler=copy), 1)  # one that keeps them
    assert "mismatch/weight_mean" in history[0]


def test_a_loaded_checkpoint_restarts_the_copy_from_the_policy(tmp_path):
    trainer = trainer_for(sampler="stale", sampler_staleness=2, output_dir=str(tmp_path / "run"), checkpoint_every=1)
    train(trainer, 2)
    resumed = trainer_for(sampler="stale", sampler_staleness=2, output_dir=str(tmp_path / "run"), checkpoint_every=1)
    assert resumed.load_checkpoint()
    copy = resumed.grpo_step.sampler
    assert all(torch.equal(a, b) for a, b in zip(params(copy.model), params(resumed.model)))
    assert len(copy.snapshots) == 0


def test_dynamic_sampling_keeps_the_sampler_logprobs_of_the_groups_it_keeps(small_policy):
    model, tokenizer = small_policy
    sampler = SamplerCopy(model, tokenizer, small_config(sampler="bfloat16", group_size=2), "bfloat16")
    a, b = sampler(["1+2=", "3+4="], 1), sampler(["12+3="], 2)
    joined = concat_groups([(a, [1]), (b, [0])], tokenizer.eos_token_id)
    tc = joined.completion_ids.shape[1]
    assert joined.sampler_logprobs.shape == (4, tc)
    assert torch.equal(joined.sampler_logprobs[:2, : a.completion_ids.shape[1]], a.sampler_logprobs[2:4])
    assert torch.equal(joined.sampler_logprobs[2:, : b.completion_ids.shape[1]], b.sampler_logprobs[0:2])
    a.sampler_logprobs = None
    assert concat_groups([(a, [1]), (b, [0])], tokenizer.eos_token_id).sampler_logprobs is None


def test_a_resumed_bfloat16_run_repeats_the_uninterrupted_one(tmp_path):
    """The bfloat16 copy is the loaded policy cast, as it was after the last sync: resuming changes no number."""
    import json

    from grpo_tutorial.metrics import TIMING_KEYS

    def comparable(history):
        return [json.dumps({k: v for k, v in row.items() if k not in TIMING_KEYS}, sort_keys=True) for row in history]

    whole = train(trainer_for(sampler="bfloat16", output_dir=str(tmp_path / "a"), checkpoint_every=1), 3)
    train(trainer_for(sampler="bfloat16", output_dir=str(tmp_path / "b"), checkpoint_every=1), 1)
    resumed = trainer_for(sampler="bfloat16", output_dir=str(tmp_path / "b"), checkpoint_every=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GRPOWarning)
        again = resumed.train(make_arithmetic_dataset(16, 0, digits=1), 3, resume=True, progress=False)
    assert comparable(again) == comparable(whole)
