"""The package's reward functions and tasks, unchanged, inside TRL's GRPOTrainer (chapter 11).

Two short TRL runs on the CPU with a 2-layer tiny Qwen2:

- with ``correctness_reward`` plus a brevity term, TRL calls the package's reward
  with the dataset's ``answer`` column lined up with each prompt, logs exactly the
  rewards the functions returned, and the parameters move;
- with a reward that is the same for every completion (beta = 0), every advantage
  is 0 and the parameters do not move at all. This control shows that the change
  in the first run comes from the rewards, not from weight decay or bookkeeping.

The last tests check the benchmark's matched TRL configuration (``benchmarks/``)
and its arithmetic, without timing anything.

The tested range of TRL is pinned in pyproject.toml (``trl>=1.16,<1.17``).
"""

from __future__ import annotations

import dataclasses

import datasets
import pytest
import torch
import trl

from grpo_tutorial.rewards import correctness_reward
from grpo_tutorial.tasks import make_arithmetic_dataset

from helpers import small_model

GROUP = 4  # num_generations
PROMPTS = 4  # prompts per step
STEPS = 2
MAX_TOKENS = 6
BREVITY_WEIGHT = 0.5


def brevity_reward(completions, **kwargs) -> list[float]:
    """Shorter is better: 1 for an empty completion, 0 for MAX_TOKENS characters.

    An untrained model stops at random lengths, so groups differ in this reward
    even though (almost) nothing is correct yet.
    """
    return [1.0 - min(len(c), MAX_TOKENS) / MAX_TOKENS for c in completions]


def constant_reward(completions, **kwargs) -> list[float]:
    return [1.0] * len(completions)


def recording(fn, calls: list[dict]):
    """Pass-through wrapper that remembers every call TRL makes (same name, same result)."""

    def wrapped(completions, **kwargs):
        out = fn(completions, **kwargs)
        calls.append({"completions": list(completions), "kwargs": kwargs, "rewards": list(out)})
        return out

    wrapped.__name__ = fn.__name__
    return wrapped


def no_checkpointing() -> dict:
    """transformers 5 renamed gradient_checkpointing to activation_checkpointing."""
    names = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    key = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    return {key: False}


def run_trl(tmp_path, reward_funcs, reward_weights):
    """Two TRL GRPO steps with the tiny model; returns (trainer, parameters before)."""
    model, tokenizer = small_model(seed=0)
    rows = make_arithmetic_dataset(32, 0, digits=1)
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1,
        max_steps=STEPS,
        seed=0,
        per_device_train_batch_size=PROMPTS * GROUP,  # counts completions, not prompts
        num_generations=GROUP,
        max_completion_length=MAX_TOKENS,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        beta=0.0,
        loss_type="grpo",
        reward_weights=reward_weights,
        **no_checkpointing(),
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer.train()
    return trainer, before


def step_logs(trainer) -> list[dict]:
    return [row for row in trainer.state.log_history if "reward" in row]


def test_trl_trains_with_package_rewards(tmp_path):
    calls: list[dict] = []
    trainer, before = run_trl(
        tmp_path,
        [recording(correctness_reward, calls), brevity_reward],
        [1.0, BREVITY_WEIGHT],
    )

    # TRL called the package's reward once per step, on whole groups, with the answers lined up
    assert len(calls) == STEPS
    for call in calls:
        prompts, answers = call["kwargs"]["prompts"], call["kwargs"]["answer"]
        assert len(call["completions"]) == len(prompts) == len(answers) == PROMPTS * GROUP
        for g in range(PROMPTS):
            group = prompts[g * GROUP : (g + 1) * GROUP]
            assert len(set(group)) == 1, f"group {g} mixes prompts: {group}"
        for prompt, answer, a, b in zip(prompts, answers, call["kwargs"]["a"], call["kwargs"]["b"]):
            assert prompt == f"{a}+{b}=" and answer == str(a + b)
        # the function ran unchanged: same scores as calling it directly
        assert call["rewards"] == correctness_reward(call["completions"], answer=answers)

    # the rewards TRL logged are exactly the ones the functions returned
    logs = step_logs(trainer)
    assert [row["step"] for row in logs] == list(range(1, STEPS + 1))
    for row, call in zip(logs, calls):
        correct = call["rewards"]
        brief = brevity_reward(call["completions"])
        total = [c + BREVITY_WEIGHT * s for c, s in zip(correct, brief)]
        assert row["rewards/correctness_reward/mean"] == pytest.approx(sum(correct) / len(correct), abs=1e-6)
        assert row["rewards/brevity_reward/mean"] == pytest.approx(sum(brief) / len(brief), abs=1e-6)
        assert row["reward"] == pytest.approx(sum(total) / len(total), abs=1e-6)
        assert row["frac_reward_zero_std"] < 1.0, "precondition: some group must have a learning signal"
        assert row["grad_norm"] > 0

    # and training happened: the policy's parameters moved
    after = dict(trainer.model.named_parameters())
    changed = [name for name, p in before.items() if not torch.equal(p, after[name].detach())]
    assert len(changed) >= len(before) // 2, f"only {changed} changed"


def test_trl_equal_rewards_leave_parameters_unchanged(tmp_path):
    """The control: no reward differences, beta = 0, so zero advantages and zero gradient."""
    trainer, before = run_trl(tmp_path, [constant_reward], None)
    logs = step_logs(trainer)
    assert len(logs) == STEPS
    for row in logs:
        assert row["reward"] == 1.0 and row["frac_reward_zero_std"] == 1.0
        assert row["grad_norm"] == 0.0
    after = dict(trainer.model.named_parameters())
    for name, p in before.items():
        assert torch.equal(p, after[name].detach()), f"{name} changed although every advantage was 0"


# ---------------------------------------------------------------------------
# The benchmark's matched configuration and its arithmetic (benchmarks/)
# ---------------------------------------------------------------------------


def test_benchmark_trl_config_matches_the_package_config(tmp_path):
    """benchmarks.trainers compares the trainers at this config; it must really match."""
    from benchmarks.trainers import SPECS, ours_config, trl_args

    for spec in SPECS.values():
        ours = ours_config(spec)
        theirs = trl_args(spec, steps=3, output_dir=str(tmp_path))
        # one generation = one optimizer step over all B*G completions
        assert theirs.generation_batch_size == ours.prompts_per_step * ours.group_size
        assert theirs.generation_batch_size // theirs.num_generations == ours.prompts_per_step
        assert theirs.steps_per_generation == 1 and theirs.gradient_accumulation_steps == 1
        assert theirs.num_generations == ours.group_size
        assert theirs.max_completion_length == ours.max_new_tokens
        assert theirs.generation_kwargs == {"min_new_tokens": ours.max_new_tokens}
        assert (theirs.num_iterations, theirs.beta, theirs.loss_type, theirs.scale_rewards) == (
            ours.num_iterations, ours.beta, ours.loss_type, ours.scale_rewards
        )
        assert (theirs.epsilon, theirs.learning_rate, theirs.max_grad_norm) == (
            ours.clip_eps, ours.learning_rate, ours.max_grad_norm
        )
        assert theirs.bf16 is False and theirs.fp16 is False
        assert theirs.gradient_checkpointing is False
        assert str(getattr(theirs.lr_scheduler_type, "value", theirs.lr_scheduler_type)) == "constant"


def test_benchmark_statistics():
    from benchmarks.common import ratio, summarize

    s = summarize([3.0, 1.0, 2.0, 10.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.5, 1.0, 10.0, 4)
    r = ratio(summarize([2.0, 4.0, 6.0]), summarize([1.0, 2.0, 4.0]))
    assert r == {"median": 2.0, "min": 0.5, "max": 6.0}
    with pytest.raises(ValueError, match="non-empty"):
        summarize([])


def test_benchmark_flop_counts_on_the_tiny_model(tiny_policy):
    """6ND counts every parameter on every token; 'counted' only what is multiplied."""
    from benchmarks.mfu import flop_counts

    model, _ = tiny_policy  # hidden 128, 3 layers, 4 heads, 21-token vocabulary, tied
    counts = flop_counts(model, rows=2, seq_len=5, completion_len=2)
    assert counts["parameters"] == 791_168 and counts["tied_embeddings"] is True
    assert counts["output_layer_parameters"] == 21 * 128
    assert counts["non_embedding_parameters"] == 791_168 - 21 * 128
    assert counts["tokens"] == 10 and counts["scored_positions"] == 6  # 2 rows x (Tc + 1)
    assert counts["flops_6nd"] == 6 * 791_168 * 10
    attention = 12 * 3 * 2 * 5**2 * 128  # 12 L N T^2 d
    assert counts["flops_counted"] == 6 * (791_168 - 21 * 128) * 10 + 6 * 21 * 128 * 6 + attention


def batch_mean_reward(completions, **kwargs) -> float:
    """The mistake of chapter 11's signature exercise: one float for the whole batch."""
    return 0.5


def short_list_reward(completions, **kwargs) -> list[float]:
    """One reward too few."""
    return [0.5] * (len(completions) - 1)


def test_trl_bare_float_reward_raises_type_error_not_value_error(tmp_path):
    """Chapter 11, exercise ch11-ex-signatures, item 4, pinned on TRL's own code path.

    TRL 1.16 iterates over the reward function's result (to turn None into NaN)
    before it checks the length, so a bare float fails with Python's TypeError
    "'float' object is not iterable", which does not name the reward function.
    Only a list of the wrong length reaches the ValueError that names it.
    """
    with pytest.raises(TypeError, match="'float' object is not iterable"):
        run_trl(tmp_path / "float", [batch_mean_reward], None)
    with pytest.raises(ValueError, match="short_list_reward.*returned 15 rewards, but 16 were expected"):
        run_trl(tmp_path / "short", [short_list_reward], None)
