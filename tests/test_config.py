"""grpo_tutorial/config.py: the batch arithmetic a config derives, its dict form, its docs, and what it refuses.

Only what does not depend on where the loss's settings are stored: the derived
sizes of a step, ``to_dict`` back through ``GRPOConfig(**d)``, :func:`field_docs`
for every field, and refusals of the batch, sampling and run fields.
(``tests/test_validation.py`` tables every field's refusal.)
"""

import dataclasses
import json
import math
from pathlib import Path

import pytest

from grpo_tutorial.config import GRPOConfig, field_docs

FIELDS = [f.name for f in dataclasses.fields(GRPOConfig)]


# ---------------------------------------------------------------------------
# the sizes of a step
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, batch, update, micro, updates",
    [
        ({}, 128, 128, 128, 1),  # B = 16, G = 8, mu = 1: one on-policy update of all 128 completions
        ({"prompts_per_step": 2, "group_size": 4, "micro_batch_size": 4}, 8, 8, 4, 1),  # micro-batches: memory only
        ({"prompts_per_step": 4, "group_size": 6, "minibatch_size": 8}, 24, 8, 8, 3),
        ({"prompts_per_step": 4, "group_size": 6, "minibatch_size": 8, "micro_batch_size": 2, "num_iterations": 3},
         24, 8, 2, 9),  # mu * N / minibatch = 3 * 24 / 8
        ({"prompts_per_step": 1, "group_size": 2, "num_iterations": 2}, 2, 2, 2, 2),
    ],
)
def test_derived_sizes(kwargs, batch, update, micro, updates):
    cfg = GRPOConfig(**kwargs)
    assert (cfg.batch_completions, cfg.update_size, cfg.micro_size, cfg.updates_per_step) == (batch, update, micro, updates)
    assert cfg.batch_completions == cfg.prompts_per_step * cfg.group_size
    assert cfg.batch_completions % cfg.update_size == 0 and cfg.update_size % cfg.micro_size == 0


def test_derived_sizes_follow_a_changed_field():
    cfg = GRPOConfig(prompts_per_step=2, group_size=4)
    cfg.group_size = 8  # properties, not values stored when the config was built
    assert (cfg.batch_completions, cfg.update_size, cfg.micro_size) == (16, 16, 16)


# ---------------------------------------------------------------------------
# to_dict, and back
# ---------------------------------------------------------------------------


def test_to_dict_has_every_field_and_builds_the_same_config():
    cfg = GRPOConfig(
        group_size=4, prompts_per_step=3, max_new_tokens=7, learning_rate=3e-3, minibatch_size=6,
        reward_weights=[1.0, 0.5], system_prompt="Be brief.", seed=5, output_dir="out",
    )
    d = cfg.to_dict()
    assert list(d) == FIELDS
    assert d["group_size"] == 4 and d["reward_weights"] == [1.0, 0.5] and d["output_dir"] == "out"
    assert GRPOConfig(**d) == cfg
    assert GRPOConfig(**json.loads(json.dumps(d))) == cfg  # and through JSON (run.json, a checkpoint's meta)
    d["reward_weights"].append(2.0)
    assert cfg.reward_weights == [1.0, 0.5]  # a copy: changing the dict leaves the config alone


def test_to_dict_of_the_defaults_round_trips():
    assert GRPOConfig(**GRPOConfig().to_dict()) == GRPOConfig()


def test_values_are_normalised_when_built():
    cfg = GRPOConfig(reward_weights=(1, 2), output_dir=Path("/tmp") / "run")
    assert cfg.reward_weights == [1.0, 2.0] and all(type(w) is float for w in cfg.reward_weights)
    assert cfg.output_dir == "/tmp/run" and isinstance(cfg.output_dir, str)
    assert GRPOConfig(**cfg.to_dict()) == cfg
    # LoRA's targets: a list of names stays a list, a one-item ["all-linear"] (the command line's) is that name
    assert GRPOConfig(lora_target_modules=("q_proj", "v_proj")).lora_target_modules == ["q_proj", "v_proj"]
    assert GRPOConfig(lora_target_modules=["all-linear"]).lora_target_modules == "all-linear"
    assert GRPOConfig(lora_target_modules=["q_proj"]).lora_target_modules == ["q_proj"]  # a name, not a regex


def test_lora_defaults():
    """TRL's ModelConfig names and defaults (tests/test_lora.py compares them with TRL's own), but every
    linear layer where TRL leaves PEFT's per-model default (q and v projections)."""
    cfg = GRPOConfig()
    assert (cfg.use_peft, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout) == (False, 16, 32.0, 0.05)
    assert cfg.lora_target_modules == "all-linear"


# ---------------------------------------------------------------------------
# field_docs
# ---------------------------------------------------------------------------


def test_field_docs_documents_every_field_and_nothing_else():
    docs = field_docs()
    assert set(docs) == set(FIELDS)
    for name, text in docs.items():
        assert text.strip() == text and len(text.split()) >= 2, (name, text)
        assert "\n" not in text  # one line, for train --help


def test_field_docs_exact_entries():
    docs = field_docs()
    assert docs["group_size"] == "G, completions per prompt (>= 2: a group needs a baseline)."
    # one entry may document several fields: each gets the whole text
    assert docs["learning_rate"] == docs["weight_decay"] == "AdamW settings."
    # an entry over several lines is joined with single spaces
    assert docs["max_grad_norm"] == (
        "gradient clipping threshold (None = no clipping, but the norm is still measured and logged)."
    )


# ---------------------------------------------------------------------------
# refused values, with their messages
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"group_size": 1}, ValueError,
         "GRPOConfig.group_size must be an int >= 2, got 1; a group needs at least 2 completions to have a baseline"),
        ({"prompts_per_step": 2.0}, TypeError, "GRPOConfig.prompts_per_step must be an int >= 1, got 2.0 (type float)"),
        ({"checkpoint_every": True}, TypeError, "GRPOConfig.checkpoint_every must be an int >= 0, got True (type bool)"),
        ({"seed": -1}, ValueError, "GRPOConfig.seed must be an int >= 0, got -1"),
        ({"prompts_per_step": 4, "group_size": 3, "minibatch_size": 5}, ValueError,
         "GRPOConfig.minibatch_size must be a divisor of prompts_per_step*group_size = 4*3 = 12, got 5"),
        ({"prompts_per_step": 4, "group_size": 4, "minibatch_size": 8, "micro_batch_size": 3}, ValueError,
         "GRPOConfig.micro_batch_size must be a divisor of the update size 8 (minibatch_size, or B*G when it is None), "
         "got 3"),
        ({"temperature": 0}, ValueError, "GRPOConfig.temperature must be a number > 0, got 0"),
        ({"learning_rate": 0}, ValueError,
         "GRPOConfig.learning_rate must be a positive number (e.g. 1e-4 for the tiny model), got 0"),
        ({"reward_weights": "1,2"}, TypeError,
         "GRPOConfig.reward_weights must be None or a list of numbers, got '1,2' (type str)"),
        ({"reward_weights": [1, math.nan]}, ValueError,
         "GRPOConfig.reward_weights must be a list of finite numbers, got [1, nan]"),
        ({"output_dir": 3}, TypeError, "GRPOConfig.output_dir must be None or a path, got 3 (type int)"),
        ({"use_chat_template": "yes"}, TypeError,
         "GRPOConfig.use_chat_template must be None (auto), True or False, got 'yes' (type str)"),
        ({"use_peft": 1}, TypeError, "GRPOConfig.use_peft must be True or False, got 1 (type int)"),
        ({"lora_r": 0}, ValueError, "GRPOConfig.lora_r must be an int >= 1, got 0"),
        ({"lora_r": 4.0}, TypeError, "GRPOConfig.lora_r must be an int >= 1, got 4.0 (type float)"),
        ({"lora_alpha": 0}, ValueError, "GRPOConfig.lora_alpha must be a number > 0 (TRL's default: 32), got 0"),
        ({"lora_dropout": 1.0}, ValueError, "GRPOConfig.lora_dropout must be a number in [0, 1), got 1.0"),
        ({"lora_target_modules": []}, ValueError,
         "GRPOConfig.lora_target_modules must be None, 'all-linear', a regular expression or a list of module "
         "names, got []"),
        ({"lora_target_modules": ["all-linear", "q_proj"]}, ValueError,
         "GRPOConfig.lora_target_modules must be None, 'all-linear', a regular expression or a list of module "
         "names, got ['all-linear', 'q_proj']: 'all-linear' stands alone"),
        ({"lora_target_modules": 3}, TypeError,
         "GRPOConfig.lora_target_modules must be None, 'all-linear', a regular expression or a list of module "
         "names, got 3 (type int)"),
    ],
)
def test_refused_values(kwargs, error, message):
    with pytest.raises(error) as caught:
        GRPOConfig(**kwargs)
    assert str(caught.value) == message


def test_top_p_below_one_is_refused_with_the_reason():
    with pytest.raises(ValueError) as caught:
        GRPOConfig(top_p=0.9)
    text = str(caught.value)
    assert text.startswith("GRPOConfig.top_p must be 1.0 for training, got 0.9: nucleus sampling")
    assert text.endswith("Lower the temperature instead to sample more conservatively (or declare the sampler "
                         "with sampler='top_p', whose own log-probs the correction can use)")
    # the guard is lifted for the declared top-p sampler only, which needs top_p < 1
    assert GRPOConfig(top_p=0.9, sampler="top_p").top_p == 0.9
    for sampler in ("bfloat16", "stale"):
        with pytest.raises(ValueError, match=r"^GRPOConfig.top_p must be 1.0 for training, got 0.9"):
            GRPOConfig(top_p=0.9, sampler=sampler)
    with pytest.raises(ValueError, match=r"^GRPOConfig.top_p must be a number in \(0, 1\) with sampler='top_p', got 1.0$"):
        GRPOConfig(sampler="top_p")


def test_a_batch_baseline_needs_a_batch_or_no_scale():
    with pytest.raises(ValueError, match=r"^GRPOConfig.scale_rewards must be 'batch' or 'none' with "
                                         r"advantage_baseline='batch', got 'group': a group whose rewards"):
        GRPOConfig(advantage_baseline="batch")
    assert GRPOConfig(advantage_baseline="batch", scale_rewards="batch").scale_rewards == "batch"
