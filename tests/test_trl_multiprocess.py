"""TRL's GRPOTrainer in 2 CPU processes (torchrun, accelerate's MULTI_CPU over gloo), as chapter 11 runs it.

The script is ``grpo_tutorial.chapters.trl_multiprocess``; this test launches it
exactly as the chapter does and reads what each rank recorded. Data parallelism
promises two things, and both are checked from the raw records:

- after 2 steps both ranks hold identical parameters (and not the initial ones);
- each rank's reward function saw only its own completions, yet the logged reward
  is the mean over the completions of both ranks (TRL gathers the rewards before
  it normalises them per group and logs them).
"""

from __future__ import annotations

import pytest

from grpo_tutorial.chapters.trl_multiprocess import BREVITY_WEIGHT, GROUP, launch, summarize, torchrun_command

pytestmark = pytest.mark.slow

STEPS = 2


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("trl2"), nproc=2, steps=STEPS, timeout=300)


def test_two_ranks_in_multi_cpu_mode(run):
    ranks = run["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert r["world_size"] == 2
        assert r["distributed_type"] == "DistributedType.MULTI_CPU"
        assert r["backend"] == "gloo"
    assert run["command"].startswith("torchrun --nproc_per_node 2 ")
    for rank in (0, 1):
        assert f"rank {rank}/2 (DistributedType.MULTI_CPU, gloo): 2 steps, 8+8 completions scored here" in run["output"]
    for rank in (0, 1):
        assert f"rank {rank}/2 (DistributedType.MULTI_CPU, gloo)" in run["output"]


def test_both_ranks_end_with_identical_moved_parameters(run):
    r0, r1 = run["ranks"]
    assert r0["digest_before"] == r1["digest_before"]
    assert r0["digest_after"] == r1["digest_after"]
    assert r0["digest_after"] != r0["digest_before"], "training did not move the parameters"


def test_each_rank_scores_its_own_completions(run):
    r0, r1 = run["ranks"]
    for rank in (r0, r1):
        assert len(rank["correctness_calls"]) == STEPS
        for call in rank["correctness_calls"]:
            assert len(call["completions"]) == len(call["prompts"]) == 8 == len(call["rewards"])
    # the ranks drew different prompts: the batch was split between them, not copied
    for c0, c1 in zip(r0["correctness_calls"], r1["correctness_calls"]):
        assert set(c0["prompts"]).isdisjoint(c1["prompts"]), (c0["prompts"], c1["prompts"])
        assert len(set(c0["prompts"] + c1["prompts"])) == 16 // GROUP


def test_logged_rewards_cover_both_ranks(run):
    r0, r1 = run["ranks"]
    assert len(r0["log_history"]) == STEPS
    ranks_differ = False
    for i in range(STEPS):
        c0, c1 = r0["correctness_calls"][i]["rewards"], r1["correctness_calls"][i]["rewards"]
        b0, b1 = r0["brevity_calls"][i]["rewards"], r1["brevity_calls"][i]["rewards"]
        total0 = [c + BREVITY_WEIGHT * b for c, b in zip(c0, b0)]
        total1 = [c + BREVITY_WEIGHT * b for c, b in zip(c1, b1)]
        for log in (r0["log_history"][i], r1["log_history"][i]):
            assert log["step"] == i + 1
            assert log["rewards/correctness_reward/mean"] == pytest.approx(sum(c0 + c1) / 16, abs=1e-6)
            assert log["rewards/brevity_reward/mean"] == pytest.approx(sum(b0 + b1) / 16, abs=1e-6)
            assert log["reward"] == pytest.approx(sum(total0 + total1) / 16, abs=1e-6)
        ranks_differ |= abs(sum(total0) - sum(total1)) > 1e-6
    # precondition: had TRL logged one rank's mean only, some step would show it
    assert ranks_differ


def test_summary_agrees_with_the_records(run):
    summary = summarize(run["ranks"])
    assert summary["identical_parameters"] and summary["parameters_moved"]
    assert summary["distributed_type"] == "DistributedType.MULTI_CPU" and summary["world_size"] == 2
    for step in summary["steps"]:
        assert step["completions_per_rank"] == [8, 8]
        assert step["correctness_logged"] == pytest.approx(step["correctness_mean_all_ranks"], abs=1e-6)
        assert step["reward_logged"] == pytest.approx(step["reward_mean_all_ranks"], abs=1e-6)
        assert step["logged_same_on_every_rank"]


def test_summary_detects_diverged_ranks(run):
    """summarize is not a rubber stamp: different digests or a one-rank log are caught."""
    import copy

    ranks = copy.deepcopy(run["ranks"])
    ranks[1]["digest_after"] = "0" * 64
    ranks[1]["log_history"][0]["reward"] += 1.0
    summary = summarize(ranks)
    assert not summary["identical_parameters"]
    assert not summary["steps"][0]["logged_same_on_every_rank"]


def test_launch_command_uses_a_given_port_and_the_module():
    cmd = torchrun_command("out", nproc=2, steps=3, port=29999)
    assert cmd[1:] == [
        "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", "29999", "-m", "grpo_tutorial.chapters.trl_multiprocess", "--out", "out", "--steps", "3",
    ]
