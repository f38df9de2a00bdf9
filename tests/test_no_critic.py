"""Chapter 17's runner (grpo_tutorial/chapters/no_critic.py) on chapter 13's quick recipe: seconds, proves nothing."""

from __future__ import annotations

import statistics

import pytest
import torch

from grpo_tutorial.chapters.no_critic import METHODS, compute_per_step, run_method, summarize_methods, training_bytes
from grpo_tutorial.chapters.thinking import ThinkingRecipe, make_thinking_data
from grpo_tutorial.ppo.vine import MonteCarloSettings
from helpers import StepState

#: An untrained quick model: every group's reward is 0 at first, which the trainer warns about.
pytestmark = pytest.mark.filterwarnings("ignore:no learning signal", "ignore:.*hit max_new_tokens")


@pytest.fixture
def quick(make_small_policy):
    recipe = ThinkingRecipe.quick(grpo_steps=2, eval_every=1)
    model, tok = make_small_policy(seed=0, max_position_embeddings=recipe.max_position_embeddings)
    return recipe, make_thinking_data(recipe), model, tok


def test_every_method_runs_from_a_copy_and_reports_its_costs(quick):
    recipe, data, model, tok = quick
    before = [p.detach().clone() for p in model.parameters()]
    runs = [run_method(m, model, tok, data, recipe, 0, monte_carlo=MonteCarloSettings(2, 2)) for m in METHODS]
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))  # each trained a copy:
    assert all(run["model"] is not model for run in runs)  # (an untrained model gets no reward, so check that too)
    policy = sum(p.numel() for p in model.parameters())
    for run in runs:
        assert [p["step"] for p in run["curve"]] == [0, 1, 2] and len(run["history"]) == 2
        assert run["parameters"]["policy"] == policy
        assert run["curve"][0]["accuracy"] == runs[0]["curve"][0]["accuracy"]  # the same start, the same seed
    by = {run["method"]: run for run in runs}
    assert by["ppo"]["parameters"]["value_model"] == policy + model.config.hidden_size + 1
    assert by["ppo"]["critic_passes"] == {"forward_no_grad": 1, "forward_backward": 1}
    # weights and AdamW's two moments, float32: 3 x 4 bytes a weight, and a 4-byte step count a tensor
    tensors = len(list(model.parameters()))
    assert by["grpo"]["training_bytes"] == 12 * policy + 4 * tensors
    critic = by["ppo"]["parameters"]["value_model"]
    assert by["ppo"]["training_bytes"] == 12 * (policy + critic) + 4 * (2 * tensors + 2)  # the head: 2 tensors
    assert all("explained_variance" in row for row in by["ppo"]["history"])
    extra = [row["extra_tokens"] for row in by["monte_carlo"]["history"]]
    assert all(e > 0 for e in extra) and all(row["extra_tokens"] == 0 for row in by["grpo"]["history"])
    summary = summarize_methods(runs)
    assert set(summary) == set(METHODS) and summary["ppo"]["steps"] == [0, 1, 2]
    assert summary["monte_carlo"]["sampled_tokens"]["mean"] > summary["grpo"]["sampled_tokens"]["mean"]


def test_the_sampled_tokens_of_a_step():
    row = {"completion_len_mean": 12.5, "mc_extra_tokens": 30.0}
    assert compute_per_step(row, 8) == {"sampled_tokens": 130.0, "own_tokens": 100.0, "extra_tokens": 30.0}
    assert compute_per_step({"completion_len_mean": 2.0}, 4)["sampled_tokens"] == 8.0


def test_training_bytes_count_shared_weights_once_and_the_optimizer_state():
    layer = torch.nn.Linear(3, 2)  # 8 weights
    both = torch.nn.Sequential(layer, layer)
    optimizer = torch.optim.AdamW(layer.parameters())
    assert training_bytes([both, layer], [optimizer]) == 8 * 4
    layer(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    assert training_bytes([both], [optimizer]) == 8 * 4 * 3 + 2 * 4  # the moments, and each tensor's step count


def test_an_unknown_method_is_refused(quick):
    recipe, data, model, tok = quick
    with pytest.raises(ValueError, match="method must be one of"):
        run_method("a2c", model, tok, data, recipe, 0)


@pytest.mark.slow
def test_the_command_runs_every_method_for_each_seed(tmp_path):
    from benchmarks import no_critic

    import json

    out, cache = tmp_path / "record.json", tmp_path / "cache"
    args = ["--quick", "--seeds", "0", "1", "--steps", "1", "--eval-every", "1", "--jobs", "2", "--mc-prompts", "2",
            "--n-test", "12", "--cache", str(cache), "--out", str(out)]
    record = no_critic.main(args)
    assert [(r["seed"], r["method"]) for r in record["runs"]] == [(s, m) for s in (0, 1) for m in METHODS]
    assert set(record["summary"]) == set(METHODS) and all(e["seeds"] == 2 for e in record["summary"].values())
    mc = [r for r in record["runs"] if r["method"] == "monte_carlo"]
    assert all(r["settings"]["config"]["prompts_per_step"] == 2 for r in mc)  # fewer prompts: compute-matched
    assert not record["warm_starts"][0]["shipped"]  # the quick recipe trains its own
    assert "model" not in record["runs"][0] and out.read_text().startswith("{")
    assert all(p["n"] == 12 for r in record["runs"] for p in r["curve"])  # --n-test: the first 12 held-out problems
    assert record["load"]["during"]["n"] >= 1 and record["cpu_capability"] and record["settings"]["n_test"] == 12
    # run again: everything comes from the cache, the same runs
    first = json.loads(out.read_text())["runs"]
    assert sorted(p.name for p in cache.glob("run_*.json")) == sorted(f"run_{s}_{m}.json" for s in (0, 1)
                                                                     for m in METHODS)
    marked = cache / "run_1_ppo.json"  # a mark that only a run read from the cache carries
    marked.write_text(json.dumps({**json.loads(marked.read_text()), "seconds": -1.0}))
    no_critic.main(args)
    again = json.loads(out.read_text())["runs"]
    assert [r["seconds"] for r in again if (r["seed"], r["method"]) == (1, "ppo")] == [-1.0]
    assert [{**r, "seconds": 0} for r in again] == [{**r, "seconds": 0} for r in first]
    with pytest.raises(SystemExit, match="another recipe"):  # a cache made with other settings is refused
        no_critic.main([*args, "--value-lr", "0.01"])


@pytest.mark.parametrize("baseline", ["group", "rloo"])
def test_grpos_advantage_variance_is_what_the_baseline_leaves(small_policy, baseline):
    """advantage_var of GRPO's and RLOO's rows: over the real tokens, r_i minus the group's (or the others') mean,
    each token carrying its completion's; the loss's advantages stay the package's (z-scores)."""
    from grpo_tutorial import GRPOConfig
    from grpo_tutorial.chapters.no_critic import MeasuredStep

    class Kept(MeasuredStep):
        def advantages(self, rewards):
            self.rewards = rewards
            return super().advantages(rewards)

    model, tok = small_policy
    config = GRPOConfig(group_size=4, prompts_per_step=2, max_new_tokens=8, seed=3, advantage_baseline=baseline)
    step = Kept(model, tok, lambda prompts, completions, **kw: [len(c) / 4 for c in completions], config)
    row = step([{"prompt": "12+34=", "answer": "46"}, {"prompt": "7+5=", "answer": "12"}], StepState(), [])
    rewards = step.rewards.rewards.tolist()
    lengths = step.rewards.rollout.completion_mask.sum(1).tolist()
    tokens = []
    for i, (r, n) in enumerate(zip(rewards, lengths)):
        group = rewards[4 * (i // 4) : 4 * (i // 4) + 4]
        others = [x for j, x in enumerate(group) if j != i % 4]
        b = statistics.mean(group) if baseline == "group" else statistics.mean(others)
        tokens += [r - b] * int(n)
    assert row["advantage_var"] == pytest.approx(statistics.pvariance(tokens), rel=1e-5)
    assert row["advantage_var"] > 0
