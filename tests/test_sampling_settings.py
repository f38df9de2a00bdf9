"""A run's sampling settings reach ``generate`` from every entry point that samples for a run (issue 44).

Each entry point (the trainer, the evaluation, chapter 9's probe, the bug gallery,
the lab's pass@k and rejection sampling, chapter 13's held-out samples, chapter 6's
audit, the fast sampler, the rollout benchmark) is run once with a config whose
sampling settings are all off their defaults; a spy on the model's ``generate``
and on the oneDNN switch records what each call was given. They all take the
settings from :func:`grpo_tutorial.rollout.sampling_kwargs`, so a setting added
there reaches every one of them.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest

import grpo_tutorial.rollout as rollout_module
from grpo_tutorial import GRPOConfig, GRPOTrainer, GRPOWarning, correctness_reward, evaluate_policy
from grpo_tutorial.rollout import generate_rollouts, pad_token_id, sampling_kwargs

#: Every sampling setting off its default. sampler="top_p" is the one sampler top_p < 1 is allowed with.
SAMPLING = dict(group_size=3, prompts_per_step=2, max_new_tokens=5, temperature=0.7, top_p=0.9, sampler="top_p",
                onednn_generation=False, seed=0)
#: The same without top_p, for the policy's own sampler (the trainer's default) and the gallery (which refuses
#: a sampler copy).
POLICY_SAMPLING = {**SAMPLING, "top_p": 1.0, "sampler": "policy", "temperature": 1.3}
ROWS = [{"prompt": "1+2=", "answer": "3"}, {"prompt": "4+4=", "answer": "8"}]


class Spy:
    """Records each ``generate`` call's keyword arguments and rows, and each oneDNN switch it was asked for."""

    def __init__(self, model, monkeypatch) -> None:
        self.calls: list[dict] = []
        self.onednn: list = []
        real_generate, real_switch = type(model).generate, rollout_module.use_onednn

        def generate(*args, **kwargs):
            self.calls.append({**kwargs, "rows": kwargs["input_ids"].shape[0]})
            return real_generate(model, *args, **kwargs)

        def switch(m, flag):
            self.onednn.append(flag)
            return real_switch(m, flag)

        monkeypatch.setattr(model, "generate", generate)
        monkeypatch.setattr(rollout_module, "use_onednn", switch)


def run_trainer(model, tok, cfg):
    with warnings.catch_warnings():  # an untrained model: no signal, truncated completions (warned about)
        warnings.simplefilter("ignore", GRPOWarning)
        GRPOTrainer(model, tok, correctness_reward, cfg).train_step(ROWS)


def run_evaluation(model, tok, cfg):
    evaluate_policy(model, tok, ROWS, cfg)


def run_probe(model, tok, cfg):
    from grpo_tutorial.chapters.gsm8k import probe_groups

    probe_groups(model, tok, cfg, ROWS, reward_fns=correctness_reward)


def run_gallery(model, tok, cfg):
    from grpo_tutorial.chapters.pitfalls import gallery_step
    from grpo_tutorial.optim import make_optimizer, trainable_parameters

    gallery_step(model, tok, correctness_reward, ROWS, cfg, *make_optimizer(trainable_parameters(model), cfg), step=0)


def run_passk(model, tok, cfg):
    from grpo_tutorial.chapters.lab import correct_counts

    correct_counts(model, tok, ROWS, cfg, n=cfg.group_size, seed=0)


def run_rejection_sampling(model, tok, cfg):
    from grpo_tutorial.chapters.lab import RejectionSamplingFT
    from grpo_tutorial.chapters.recipes import TinyAdditionRecipe

    recipe = dataclasses.replace(TinyAdditionRecipe.quick(), grpo=cfg)
    RejectionSamplingFT(model, tok, recipe, seed=0).train_step(ROWS)


def run_heldout(model, tok, cfg):
    from grpo_tutorial.chapters.thinking import heldout_stats

    heldout_stats(model, tok, ROWS, cfg, seed=0)


def run_audit(model, tok, cfg):
    from grpo_tutorial.chapters.reward_design import sample_audit

    sample_audit(model, tok, ROWS, [correctness_reward], cfg)


def run_fast_sampler(model, tok, cfg):
    from grpo_tutorial.sampling.fast import FastSampler

    FastSampler(model, tok, cfg, merge=False, static=False)([row["prompt"] for row in ROWS], 0)


def run_benchmark(model, tok, cfg):
    from benchmarks.rollout import batched_once

    batched_once(model, tok, [row["prompt"] for row in ROWS], cfg, seed=0)


#: (entry point, its config's settings, completions per prompt, sampled: False for a greedy evaluation)
ENTRY_POINTS = {
    "trainer, sampler top_p": (run_trainer, SAMPLING, 3, True),
    "trainer, the policy": (run_trainer, POLICY_SAMPLING, 3, True),
    "evaluation": (run_evaluation, SAMPLING, 1, False),
    "chapter 9's probe": (run_probe, SAMPLING, 3, True),
    "the bug gallery": (run_gallery, POLICY_SAMPLING, 3, True),
    "the lab's pass@k": (run_passk, SAMPLING, 3, True),
    "the lab's rejection sampling": (run_rejection_sampling, SAMPLING, 3, True),
    "chapter 13's held-out samples": (run_heldout, SAMPLING, 1, True),
    "chapter 6's audit": (run_audit, SAMPLING, 3, True),
    "the fast sampler": (run_fast_sampler, SAMPLING, 3, True),
    "the rollout benchmark": (run_benchmark, SAMPLING, 3, True),
}


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_a_runs_sampling_settings_reach_generate(name, small_policy, monkeypatch):
    run, settings, per_prompt, sampled = ENTRY_POINTS[name]
    model, tok = small_policy
    cfg = GRPOConfig(**settings)
    spy = Spy(model, monkeypatch)
    run(model, tok, cfg)
    assert spy.calls, f"{name} never called generate"
    for call in spy.calls:
        assert call["max_new_tokens"] == cfg.max_new_tokens, name
        assert call["rows"] == len(ROWS) * per_prompt, name
        assert call["do_sample"] is sampled, name
        if sampled:
            assert (call["temperature"], call["top_p"]) == (cfg.temperature, cfg.top_p), name
        else:  # greedy: no sampling parameter is passed at all
            assert "temperature" not in call and "top_p" not in call, name
    assert spy.onednn and all(flag is False for flag in spy.onednn), (name, spy.onednn)


def test_sampling_kwargs_is_the_configs_settings_with_visible_overrides():
    cfg = GRPOConfig(**SAMPLING, system_prompt=None, use_chat_template=False)
    assert sampling_kwargs(cfg) == dict(
        group_size=3, max_new_tokens=5, temperature=0.7, top_p=0.9, do_sample=True, system_prompt=None,
        use_chat_template=False, onednn=False,
    )
    greedy = sampling_kwargs(cfg, group_size=1, do_sample=False, generator_seed=4)
    assert (greedy["group_size"], greedy["do_sample"], greedy["generator_seed"]) == (1, False, 4)
    assert greedy["max_new_tokens"] == 5  # what is not overridden stays the config's
    with pytest.raises(TypeError, match=r"\['seed'\].*generate_rollouts\(\) does not take"):
        sampling_kwargs(cfg, seed=3)  # a typo would otherwise be dropped silently


def test_the_default_configs_sampling_is_generate_rollouts_own_defaults(small_policy):
    """A call site that passed fewer settings before (top_p, onednn) samples the same tokens with all of them."""
    model, tok = small_policy
    prompts = [row["prompt"] for row in ROWS]
    plain = generate_rollouts(model, tok, prompts, group_size=4, max_new_tokens=5, generator_seed=11)
    full = generate_rollouts(model, tok, prompts, **sampling_kwargs(GRPOConfig(group_size=4, max_new_tokens=5),
                                                                    generator_seed=11))
    assert full.completions == plain.completions
    assert full.completion_ids.equal(plain.completion_ids)


def test_pad_token_id_falls_back_to_eos():
    tok = type("Tok", (), {"pad_token_id": None, "eos_token_id": 7})()
    assert pad_token_id(tok) == 7
    tok.pad_token_id = 0  # a pad id of 0 is a pad id, not a missing one
    assert pad_token_id(tok) == 0
    assert pad_token_id(type("NoPad", (), {"eos_token_id": 5})()) == 5
