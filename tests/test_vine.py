"""Monte Carlo values (grpo_tutorial/ppo/vine.py): K continuations from each of M prefixes value the prefix."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from grpo_tutorial import GRPOConfig
from grpo_tutorial.rollout import generate_rollouts, sampling_kwargs
from grpo_tutorial.ppo.vine import MonteCarloSettings, MonteCarloStep, cut_points, monte_carlo_advantages
from helpers import StepState

CONFIG = GRPOConfig(group_size=2, prompts_per_step=2, max_new_tokens=8, seed=5)
PROMPTS = ["12+34=", "7+5="]


class Spy:
    """A reward of a quarter per character that remembers every call: (prompt, completion, ids, reward)."""

    def __init__(self) -> None:
        self.calls: list[list[tuple]] = []
        self.__name__ = "spy"

    def __call__(self, prompts, completions, completion_ids=None, **kwargs):
        rewards = [len(c) / 4 for c in completions]
        self.calls.append(list(zip(prompts, completions, completion_ids, rewards)))
        return rewards


def prompt_only_reward(prompts, completions, **kwargs):
    """Ignores the completion: an eighth per character of the prompt (eighths are exact in binary)."""
    return [len(p) / 8 for p in prompts]


def rollout_of(model, tok, seed=1):
    return generate_rollouts(model, tok, PROMPTS, **sampling_kwargs(CONFIG, generator_seed=seed))


def run(model, tok, rollout, reward, settings=MonteCarloSettings(3, 4), step=0):
    rewards = torch.tensor(reward(rollout.prompts, rollout.completions, completion_ids=rollout.completion_id_lists()))
    return monte_carlo_advantages(model, tok, rollout, rewards, [reward], CONFIG, settings,
                                  answers=["0"] * len(rollout), step=step)


def test_cut_points_are_evenly_spaced_from_the_prompt():
    assert cut_points(72, 4) == [0, 18, 36, 54]
    assert cut_points(8, 3) == [0, 3, 5]  # 8/3 and 16/3 rounded
    assert cut_points(2, 4) == [0, 1, 2]  # more prefixes than tokens: each length once
    assert cut_points(5, 1) == [0]  # the prompt alone: one value per completion


@pytest.mark.parametrize("change", [{"num_prefixes": 0}, {"rollouts_per_prefix": -1}, {"num_prefixes": 1.5},
                                    {"rollouts_per_prefix": True}])
def test_bad_settings_are_refused(change):
    with pytest.raises((ValueError, TypeError), match=f"MonteCarloSettings.{next(iter(change))} must be an int >= 1"):
        MonteCarloSettings(**change)


def test_values_are_the_mean_reward_of_k_continuations_by_hand(small_policy):
    model, tok = small_policy
    rollout = rollout_of(model, tok)
    spy = Spy()
    out = run(model, tok, rollout, spy)
    first, calls = spy.calls[0], spy.calls[1:]  # the rollout's own rewards, then one call per cut point
    assert out["cuts"] == [0, 3, 5] and len(calls) == 3
    lengths = rollout.completion_mask.sum(1).long().tolist()
    ids = rollout.completion_id_lists()
    values = [[math.nan] * 3 for _ in lengths]
    tokens = 0
    for j, (cut, call) in enumerate(zip(out["cuts"], calls)):
        rows = [i for i, n in enumerate(lengths) if cut < n and tok.unk_token_id not in ids[i][:cut]]
        assert len(call) == 4 * len(rows)  # K = 4 continuations of each live prefix
        for n, i in enumerate(rows):
            group = call[4 * n : 4 * n + 4]
            for prompt, completion, full_ids, _ in group:
                assert prompt == rollout.prompts[i] and full_ids[:cut] == ids[i][:cut]  # the prefix, then more
                assert len(full_ids) <= CONFIG.max_new_tokens  # within the budget the completion had
                tokens += len(full_ids) - cut
            values[i][j] = statistics.mean(r for *_, r in group)
    torch.testing.assert_close(out["values"], torch.tensor(values), equal_nan=True)
    assert out["extra_tokens"] == tokens and out["extra_rollouts"] == sum(len(c) for c in calls)
    want = torch.zeros(rollout.completion_mask.shape)
    for i, n in enumerate(lengths):
        live = [c for c in out["cuts"] if c < n]
        targets = values[i][1:len(live)] + [first[i][3]]  # V of the next prefix; the reward after the last
        for j, (start, end) in enumerate(zip(live, live[1:] + [n])):
            gain = targets[j] - values[i][j]
            want[i, start:end] = 0.0 if math.isnan(gain) else gain
    torch.testing.assert_close(out["advantages"], want)
    assert out["advantages"].abs().sum() > 0


def test_a_reward_that_ignores_the_completion_gives_no_advantage(small_policy):
    model, tok = small_policy
    rollout = rollout_of(model, tok)
    out = run(model, tok, rollout, prompt_only_reward)
    assert torch.isfinite(out["values"][:, 1:]).sum() >= 4  # later prefixes were valued, not skipped
    assert not out["advantages"].any()  # every value is the reward itself: each difference exactly 0


def test_the_values_are_the_same_under_a_seed(small_policy):
    model, tok = small_policy
    rollout = rollout_of(model, tok)
    a, b = run(model, tok, rollout, Spy()), run(model, tok, rollout, Spy())
    assert torch.equal(a["advantages"], b["advantages"]) and a["extra_tokens"] == b["extra_tokens"]
    torch.testing.assert_close(a["values"], b["values"], rtol=0, atol=0, equal_nan=True)
    other = run(model, tok, rollout, Spy(), step=1)  # the next step's seeds: other continuations
    assert not torch.equal(other["advantages"], a["advantages"])


def test_a_tokenizer_that_does_not_round_trip_is_refused(small_policy, monkeypatch):
    model, tok = small_policy
    rollout = rollout_of(model, tok)
    real = tok.decode
    monkeypatch.setattr(tok, "decode", lambda ids, **kw: real(ids, **kw) + " ")
    with pytest.raises(ValueError, match="does not give back the sampled tokens"):
        run(model, tok, rollout, Spy())


def test_the_monte_carlo_step_trains_and_counts_its_extra_tokens(small_policy):
    model, tok = small_policy
    config = GRPOConfig(group_size=2, prompts_per_step=2, max_new_tokens=8, seed=5, learning_rate=1e-3)
    step = MonteCarloStep(model, tok, Spy(), config, settings=MonteCarloSettings(2, 3))
    before = [p.detach().clone() for p in model.parameters()]
    row = step([{"prompt": p, "answer": "0"} for p in PROMPTS], StepState(), [])
    assert not all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    assert row["mc_extra_tokens"] > 0 and row["mc_extra_rollouts"] > 0 and row["advantage_var"] > 0
    with pytest.raises(ValueError, match="advantage_baseline must be 'group'"):
        MonteCarloStep(model, tok, Spy(), GRPOConfig(advantage_baseline="rloo"))


def test_the_continuations_are_sampled_with_the_runs_settings(small_policy, monkeypatch):
    """As tests/test_sampling_settings.py holds every entry point: each generate call gets the config's sampling
    settings, and the budget the completion had left at its cut point."""
    import grpo_tutorial.rollout as rollout_module

    model, tok = small_policy
    config = GRPOConfig(group_size=2, prompts_per_step=2, max_new_tokens=8, seed=5, temperature=0.7, top_p=0.9,
                        sampler="top_p", onednn_generation=False)
    rollout = generate_rollouts(model, tok, PROMPTS, **sampling_kwargs(config, generator_seed=1))
    calls, switches, real = [], [], type(model).generate
    real_switch = rollout_module.use_onednn
    monkeypatch.setattr(model, "generate", lambda *a, **kw: calls.append(kw) or real(model, *a, **kw))
    monkeypatch.setattr(rollout_module, "use_onednn", lambda m, flag: switches.append(flag) or real_switch(m, flag))
    spy = Spy()
    rewards = torch.tensor(spy(rollout.prompts, rollout.completions, rollout.completion_id_lists()))
    monte_carlo_advantages(model, tok, rollout, rewards, [spy], config, MonteCarloSettings(3, 2), answers=["0"] * 4)
    assert [call["max_new_tokens"] for call in calls] == [8 - cut for cut in cut_points(8, 3)][: len(calls)]
    assert len(calls) >= 2 and switches and all(flag is False for flag in switches)
    for call in calls:
        assert call["do_sample"] is True and (call["temperature"], call["top_p"]) == (0.7, 0.9)
