"""Evaluation sees what training sees: one entry point, settings from the run's GRPOConfig.

The tests capture the text that evaluation really feeds the model (the token ids
passed to ``generate``, decoded back), not a rendering made by the test, and look
for the training system prompt in it. The model is chapter 9's CPU stand-in (a
tiny random Qwen2 over SmolLM2-135M-Instruct's tokenizer, whose chat template
inserts its own default system message when none is given, as Qwen2.5's does).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from grpo_tutorial import GRPOConfig, GRPOTrainer, correctness_reward, evaluate_policy
from grpo_tutorial.chapters import gsm8k, lab, recipes
from grpo_tutorial.chapters.gsm8k import GSM8K_PRESET, gsm8k_run, read_gsm8k_jsonl
from grpo_tutorial.presets import get_preset
from test_gsm8k_run import FIXTURE, smollm2_tokenizer, tiny_qwen2_answering_digits

SYSTEM = "Answer with one digit."


@pytest.fixture(scope="module")
def tokenizer():
    return smollm2_tokenizer()


@pytest.fixture()
def model(tokenizer):
    return tiny_qwen2_answering_digits(tokenizer)


def capture_generate_inputs(model, tokenizer) -> list[str]:
    """Record, decoded, every prompt batch that reaches ``model.generate``."""
    seen: list[str] = []
    generate = model.generate

    def recording(*args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        seen.extend(tokenizer.batch_decode(ids, skip_special_tokens=False))
        return generate(*args, **kwargs)

    model.generate = recording
    return seen


def default_system_message(tokenizer) -> str:
    """What the chat template writes when it is given no system prompt (SmolLM2's own)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True)
    system = text.split("<|im_start|>system\n", 1)[1].split("<|im_end|>", 1)[0]
    assert system and system != SYSTEM
    return system


def rows():
    return [row for row in read_gsm8k_jsonl(FIXTURE) if len(row["answer"]) == 1]


def assert_prompted_as_trained(seen: list[str], tokenizer, n: int) -> None:
    assert len(seen) >= n
    default = default_system_message(tokenizer)
    for text in seen:
        assert f"<|im_start|>system\n{SYSTEM}<|im_end|>" in text, text[:200]
        assert default not in text


def test_trainer_evaluate_renders_the_training_system_prompt(model, tokenizer):
    config = GRPOConfig(system_prompt=SYSTEM, max_new_tokens=3, eval_batch_size=4)
    trainer = GRPOTrainer(model, tokenizer, correctness_reward, config)
    seen = capture_generate_inputs(model, tokenizer)
    result = trainer.evaluate(rows())
    assert_prompted_as_trained(seen, tokenizer, len(rows()))
    assert result["n"] == len(rows()) and len(result["correct"]) == len(rows())
    assert all(isinstance(c, bool) for c in result["correct"])
    p = sum(result["correct"]) / len(rows())
    assert result["accuracy"] == p and result["se"] == math.sqrt(p * (1 - p) / len(rows()))
    assert result["completions"] == [r["completion"] for r in result["records"]]


def test_recipes_evaluate_heldout_renders_the_training_system_prompt(model, tokenizer):
    """The chapter tool chapters 8 and 9 used; it dropped the system prompt before (issue 21)."""
    config = GRPOConfig(system_prompt=SYSTEM, max_new_tokens=3, eval_batch_size=4)
    trainer = GRPOTrainer(model, tokenizer, correctness_reward, config)
    seen = capture_generate_inputs(model, tokenizer)
    result = recipes.evaluate_heldout(trainer, rows())
    assert_prompted_as_trained(seen, tokenizer, len(rows()))
    assert result["correct"] == trainer.evaluate(rows())["correct"]


def test_gsm8k_run_evaluates_under_the_prompt_it_trains_with(model, tokenizer):
    """Chapter 9's GPU run: before and after are scored on the preset's system prompt, not the template's default."""
    preset = get_preset(GSM8K_PRESET)
    seen = capture_generate_inputs(model, tokenizer)
    train_rows = rows()[:4]
    eval_rows = rows()[4:]
    result = gsm8k_run(
        model, tokenizer, GSM8K_PRESET, train_rows, eval_rows, steps=1, gradient_checkpointing=False,
        max_new_tokens=3, micro_batch_size=None,
    )
    assert result["config"].system_prompt == preset.system_prompt
    default = default_system_message(tokenizer)
    system_block = f"<|im_start|>system\n{preset.system_prompt}<|im_end|>"
    # three generate calls: before (eval), the step's rollout, after (eval): every one framed alike
    evaluations = [t for t in seen if t.count("<|im_start|>user") == 1]
    assert len(evaluations) >= 2 * len(eval_rows)
    for text in seen:
        assert system_block in text and default not in text, text[:300]


def test_cli_evaluate_uses_the_runs_config(model, tokenizer):
    from grpo_tutorial.__main__ import _evaluate

    config = GRPOConfig(system_prompt=SYSTEM, max_new_tokens=3, eval_batch_size=4)
    seen = capture_generate_inputs(model, tokenizer)
    result = _evaluate(model, tokenizer, rows(), correctness_reward, config, "gsm8k", num_samples=0)
    assert_prompted_as_trained(seen, tokenizer, len(rows()))
    assert result["n"] == len(rows())


def test_old_keywords_point_to_the_config(model, tokenizer):
    with pytest.raises(TypeError, match=r"takes system_prompt= from the run's GRPOConfig.*config=GRPOConfig\(system_prompt=\.\.\.\)"):
        evaluate_policy(model, tokenizer, rows(), system_prompt=SYSTEM)
    with pytest.raises(TypeError, match=r"config=GRPOConfig\(onednn_generation=\.\.\.\)"):
        evaluate_policy(model, tokenizer, rows(), onednn=False)
    with pytest.raises(TypeError, match="config must be a GRPOConfig"):
        evaluate_policy(model, tokenizer, rows(), {"system_prompt": SYSTEM})
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        evaluate_policy(model, tokenizer, rows(), colour="red")


def test_batch_size_changes_only_the_chunking(model, tokenizer):
    config = GRPOConfig(system_prompt=SYSTEM, max_new_tokens=3, eval_batch_size=8)
    a = evaluate_policy(model, tokenizer, rows(), config)
    b = evaluate_policy(model, tokenizer, rows(), config, batch_size=3)
    assert a["completions"] == b["completions"]


def test_lab_and_warm_start_evaluate_with_the_config_they_train_with(monkeypatch):
    """The lab's held-out curve and the warm start's probe check go through evaluate_policy with the run's config."""
    calls: list[GRPOConfig] = []
    real = recipes.evaluate_policy

    def spy(model, tokenizer, rows, config=None, **kwargs):
        calls.append(config)
        return real(model, tokenizer, rows, config, **kwargs)

    monkeypatch.setattr(recipes, "evaluate_policy", spy)
    monkeypatch.setattr(lab, "evaluate_policy", spy)
    recipe = recipes.TinyAdditionRecipe.quick(grpo_steps=2, eval_every=1, sft_max_steps=20)
    data = recipes.make_recipe_data(recipe)
    model, tokenizer = recipes.build_recipe_model(recipe, 0)
    recipes.warm_start(model, tokenizer, data, recipe, 0, progress=False)
    assert calls and all(c == recipe.grpo_config(0) for c in calls)  # the probe: the GRPO phase's config
    calls.clear()
    settings = lab.LabSettings(recipe=recipe, methods=("grpo", "dapo"), seeds=(0,), passk_problems=2, passk_n=2)
    result = lab.run_method("dapo", model, tokenizer, data, settings, 0)
    assert calls == [settings.grpo_config("dapo", 0)] * 3  # before, after step 1, after step 2
    assert result["final"]["se"] == pytest.approx(
        math.sqrt(result["final"]["accuracy"] * (1 - result["final"]["accuracy"]) / recipe.n_test)
    )


def test_a_tiny_model_without_template_is_evaluated_as_before(tiny_policy):
    """No chat template: the text is the prompt itself; the config's budget and batch size decide the rest."""
    model, tok = tiny_policy
    data = [{"prompt": "1+2=", "answer": "3"}, {"prompt": "4+4=", "answer": "8"}]
    seen = capture_generate_inputs(model, tok)
    evaluate_policy(model, tok, data, GRPOConfig(max_new_tokens=2, eval_batch_size=1))
    assert [t.replace(tok.bos_token or "", "") for t in seen] == ["1+2=", "4+4="]
