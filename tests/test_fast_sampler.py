"""Issue 43's fast sampler (grpo_tutorial/sampling/fast.py), on the CPU with the tiny models.

Merged adapters sample what the unmerged ones sample (the same logits to float
tolerance, the same tokens on a seed) from a copy that follows every update, while
the trained model's base keeps its bytes; the static KV cache gives the dynamic
cache's logits; the float16 copy is synced after every update, and a planted
float16 overflow is caught and sampled again in float32. The CUDA defaults are
shown with a stub in ``tests/test_gpu_path.py`` and measured in ``tests/test_cuda.py``.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

pytest.importorskip("peft")

from grpo_tutorial import GRPOConfig, GRPOTrainer, evaluate_policy  # noqa: E402
from grpo_tutorial.sampling import PolicySampler  # noqa: E402
from grpo_tutorial.sampling import fast as fast_sampler  # noqa: E402
from grpo_tutorial.sampling.fast import (  # noqa: E402
    COMPILE_SECONDS, DECODE_MS, FALLBACKS, FastSampler, NonFiniteGuard, build_fast_sampler, has_adapters,
    merged_copy, sampling_model,
)
from grpo_tutorial.lora import adapter_of, base_fingerprint, wrap_with_adapters  # noqa: E402
from grpo_tutorial.rollout import generate_rollouts, merge_sampler_stats  # noqa: E402
from grpo_tutorial.seeding import sampling_seed  # noqa: E402
from grpo_tutorial.speedups import PROMPT_BUCKET, bucket_width  # noqa: E402
from grpo_tutorial.tasks import make_arithmetic_dataset  # noqa: E402
from grpo_tutorial.trainer import GRPOWarning  # noqa: E402
from helpers import TWO_UPDATES, small_config

PROMPTS = ["12+34=", "7+58=", "40+9="]
#: float32 logits of order 1, summed in another order (W x + s B (A x) against (W + s B A) x): a few 1e-7 apart.
LOGIT_TOLERANCE = 1e-5


def reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def rows(n=32):
    return make_arithmetic_dataset(n, 0, digits=1)


def config(**kwargs) -> GRPOConfig:
    return small_config(**{**TWO_UPDATES, **kwargs})  # two optimizer updates a step


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GRPOWarning)
        return fn(*args, **kwargs)


def base_weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if adapter_of(k) is None}


@pytest.fixture
def adapted(small_policy):
    """The small policy with LoRA adapters whose B is not zero (as after training), so that they change the logits."""
    model, tokenizer = small_policy
    peft_model = wrap_with_adapters(model, GRPOConfig(use_peft=True, lora_r=4, lora_dropout=0.0))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
    peft_model.eval()
    return peft_model, tokenizer


class Recorder:
    """A logits processor that keeps every step's scores (a copy) and changes nothing."""

    def __init__(self):
        self.scores = []

    def __call__(self, input_ids, scores):
        self.scores.append(scores.detach().clone())
        return scores


# ---------------------------------------------------------------------------
# Merged adapters
# ---------------------------------------------------------------------------


def test_merged_and_unmerged_adapters_give_the_same_logits_and_the_same_samples(adapted):
    peft_model, tokenizer = adapted
    merged = merged_copy(peft_model)
    assert not has_adapters(merged) and has_adapters(peft_model)  # a plain model; the policy keeps its adapters
    assert not any(p.requires_grad for p in merged.parameters())
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        unmerged_logits, merged_logits = peft_model(**enc).logits, merged(**enc).logits  # [3, T, V] x2
        with peft_model.disable_adapter():
            base_logits = peft_model(**enc).logits
    torch.testing.assert_close(merged_logits, unmerged_logits, rtol=0, atol=LOGIT_TOLERANCE)
    assert (base_logits - unmerged_logits).abs().max() > 100 * LOGIT_TOLERANCE  # the adapters do change the logits
    for seed in range(3):
        a = generate_rollouts(peft_model, tokenizer, PROMPTS, group_size=8, max_new_tokens=6, generator_seed=seed)
        b = generate_rollouts(merged, tokenizer, PROMPTS, group_size=8, max_new_tokens=6, generator_seed=seed)
        assert torch.equal(a.completion_ids, b.completion_ids)


def test_the_merged_copy_follows_every_update_and_the_base_keeps_its_bytes(small_policy):
    model, tokenizer = small_policy
    trainer = GRPOTrainer(model, tokenizer, reward, config(use_peft=True, lora_r=4, merge_adapters_for_sampling=True))
    sampler = trainer.grpo_step.sampler
    assert isinstance(sampler, FastSampler) and sampler.model is not trainer.model and not sampler.static
    synced = []
    sync = sampler.sync
    sampler.sync = lambda: (synced.append(1), sync())
    fingerprint, base = base_fingerprint(trainer.model), base_weights(trainer.model)
    adapters = {k: v.clone() for k, v in trainer.model.state_dict().items() if adapter_of(k) is not None}
    history = quiet(trainer.train, rows(), 3, progress=False)
    assert len(synced) == 3 * 2  # after each of the two updates of each of the three steps
    assert base_fingerprint(trainer.model) == fingerprint
    after = base_weights(trainer.model)
    assert all(torch.equal(after[k], v) for k, v in base.items())  # every byte of the base, not only the hash's
    moved = [k for k, v in trainer.model.state_dict().items() if k in adapters and not torch.equal(v, adapters[k])]
    assert moved, "the adapters trained, so the copy had something to follow"
    fresh = merged_copy(trainer.model)  # the trained policy merged now, from scratch
    for (key, mine), (_, want) in zip(sampler.model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(mine, want), key  # re-merged after each update: the same sums PEFT's merge computes
    assert all(DECODE_MS in row and COMPILE_SECONDS not in row and math.isfinite(row["loss"]) for row in history)


def test_an_evaluation_generates_what_the_unmerged_model_generates(adapted):
    peft_model, tokenizer = adapted
    problems = rows(6)
    base = base_weights(peft_model)
    plain = evaluate_policy(peft_model, tokenizer, problems, GRPOConfig(max_new_tokens=4))
    fast = evaluate_policy(peft_model, tokenizer, problems, GRPOConfig(max_new_tokens=4, use_peft=True,
                                                                       merge_adapters_for_sampling=True))
    assert fast["completions"] == plain["completions"] and fast["correct"] == plain["correct"]
    assert all(torch.equal(v, base[k]) for k, v in base_weights(peft_model).items())
    assert sampling_model(peft_model, GRPOConfig()) is peft_model  # on the CPU, by default: not merged


def test_the_trainer_evaluates_with_its_samplers_copy_not_a_new_one(small_policy, monkeypatch):
    model, tokenizer = small_policy
    trainer = GRPOTrainer(model, tokenizer, reward, config(use_peft=True, lora_r=4, merge_adapters_for_sampling=True))
    made = []
    real = fast_sampler.merged_copy
    monkeypatch.setattr(fast_sampler, "merged_copy", lambda *a, **k: (made.append(1), real(*a, **k))[1])
    result = trainer.evaluate(rows(4))
    assert made == [] and result["n"] == 4


def test_only_plain_lora_is_merged(adapted):
    peft_model, _ = adapted
    layer = next(m for m in peft_model.modules() if hasattr(m, "lora_bias"))
    layer.lora_bias["default"] = True
    with pytest.raises(ValueError, match="plain LoRA adapters only .* set GRPOConfig.merge_adapters_for_sampling=False"):
        merged_copy(peft_model)


# ---------------------------------------------------------------------------
# The static KV cache
# ---------------------------------------------------------------------------


def test_the_static_cache_gives_the_dynamic_caches_logits_and_samples_on_the_cpu(tiny_policy):
    model, tokenizer = tiny_policy
    asked = []
    generate = model.generate
    model.generate = lambda **kwargs: (asked.append(kwargs.get("cache_implementation")), generate(**kwargs))[1]
    out = {}
    for static in (False, True):
        recorder = Recorder()
        out[static] = (generate_rollouts(model, tokenizer, PROMPTS, group_size=4, max_new_tokens=6, generator_seed=0,
                                         static_cache=static, logits_processor=(recorder,)), recorder.scores)
    (dynamic, dynamic_scores), (static, static_scores) = out[False], out[True]
    assert asked == [None, "static"] and len(static_scores) == len(dynamic_scores) == 6
    for a, b in zip(static_scores, dynamic_scores):
        torch.testing.assert_close(a, b, rtol=0, atol=LOGIT_TOLERANCE)
    assert torch.equal(static.completion_ids, dynamic.completion_ids)
    # the bucket's extra left padding is cut off again: the rollout is the plain call's, column for column
    assert torch.equal(static.prompt_ids, dynamic.prompt_ids) and torch.equal(static.prompt_mask, dynamic.prompt_mask)


def test_the_prompt_width_is_a_bucket_that_only_grows_and_a_new_shape_reports_its_seconds(tiny_policy):
    model, tokenizer = tiny_policy
    sampler = FastSampler(model, tokenizer, config(), merge=False, static=True)
    assert sampler.model is model  # nothing to merge: the policy itself
    first = sampler(["12+34="], 0)
    assert sampler.width == PROMPT_BUCKET and first.sampler_stats[COMPILE_SECONDS] > 0  # a new shape: its seconds
    assert first.sampler_stats[DECODE_MS] > 0
    again = sampler(["1+2="], 1)  # a shorter prompt: the same width, the same compiled shape
    assert sampler.width == PROMPT_BUCKET and again.sampler_stats[COMPILE_SECONDS] == 0.0
    assert again.prompt_ids.shape[1] == 5  # its own padding only
    sampler(PROMPTS[:1] * 4, 2)  # four prompts: G x 4 rows, another shape
    assert len(sampler.shapes) == 2


def test_bucket_width():
    assert [bucket_width(n) for n in (1, 64, 65, 150)] == [64, 64, 128, 192]
    assert bucket_width(10, at_least=130) == 192 and bucket_width(200, at_least=130) == 256
    assert bucket_width(5, bucket=4) == 8
    with pytest.raises(ValueError, match="bucket_width needs length >= 1"):
        bucket_width(0)


def test_the_stats_of_several_sampling_rounds_add_up():
    merged = merge_sampler_stats([{DECODE_MS: 2.0, COMPILE_SECONDS: 3.0}, None, {DECODE_MS: 4.0, COMPILE_SECONDS: 0.0,
                                                                                FALLBACKS: 1.0}])
    assert merged == {DECODE_MS: 3.0, COMPILE_SECONDS: 3.0, FALLBACKS: 1.0}
    assert merge_sampler_stats([None, None]) is None


# ---------------------------------------------------------------------------
# The float16 copy
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("use_peft", [False, True])
def test_the_float16_copy_is_the_policy_in_float16_after_every_update(small_policy, use_peft):
    model, tokenizer = small_policy
    extra = dict(use_peft=True, lora_r=4) if use_peft else {}
    trainer = GRPOTrainer(model, tokenizer, reward, config(sampler="float16", **extra))
    copy_model = trainer.grpo_step.sampler.model
    assert copy_model.dtype == torch.float16 and not has_adapters(copy_model)
    assert next(trainer.model.parameters()).dtype == torch.float32  # the learner stays in float32
    synced = []
    engine = trainer.grpo_step.sampler.engine
    sync = engine.sync
    engine.sync = lambda: (synced.append(1), sync())
    row = quiet(trainer.train_step, rows(4))
    assert len(synced) == 2  # after each update
    want = merged_copy(trainer.model, torch.float16)
    for (key, mine), (_, expected) in zip(copy_model.state_dict().items(), want.state_dict().items()):
        assert torch.equal(mine, expected), key
    # a sampler that is not the learner: chapter 15's diagnostics in the history, no fallback
    assert row[FALLBACKS] == 0.0 and DECODE_MS in row
    assert 0 < row["mismatch/kl"] < 1e-3 and row["mismatch/ess"] > 0.99


def test_a_float16_overflow_is_sampled_again_in_float32_counted_and_warned_once(small_policy):
    model, tokenizer = small_policy
    cfg = config(sampler="float16", use_peft=True, lora_r=4)
    trainer = GRPOTrainer(model, tokenizer, reward, cfg)
    copy_model = trainer.grpo_step.sampler.model
    with torch.no_grad():
        copy_model.model.norm.weight.mul_(1e5)  # planted: past float16's 65504, the last norm's output is inf
    batch = rows(4)
    expected = generate_rollouts(trainer.model, tokenizer, [r["prompt"] for r in batch], group_size=cfg.group_size,
                                 max_new_tokens=cfg.max_new_tokens, generator_seed=sampling_seed(cfg.seed, 0, 0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        row = trainer.train_step(batch)
        first = trainer.grpo_step.last_batch[1]  # the completions the first step trained on
        second = trainer.train_step(rows(4))  # the adapters' sync leaves the planted norm: it overflows again
    said = [w for w in caught if issubclass(w.category, GRPOWarning) and "float16 sampler copy" in str(w.message)]
    assert len(said) == 1  # once, though both steps fell back
    assert row[FALLBACKS] == 1.0 and second[FALLBACKS] == 1.0 and trainer.grpo_step.sampler.fallbacks == 2
    assert math.isfinite(row["loss"]) and math.isfinite(second["loss"])
    # the step trained on the float32 policy's own rollout for its seed, with the policy's log-probs as the sampler's
    assert first == expected.completions
    assert row["mismatch/logp_diff_max"] < 1e-5  # float32 scored twice (with the shared prompt cache and without)


def test_the_guard_sets_non_finite_logits_to_zero_and_remembers():
    guard = NonFiniteGuard()
    clean = torch.tensor([[0.5, -1.0, -math.inf], [2.0, 0.0, 1.0]])  # -inf: a token masked on purpose, fine
    assert torch.equal(guard(None, clean.clone()), clean) and not guard.tripped()
    bad = torch.tensor([[math.nan, 1.0, -math.inf], [math.inf, 0.0, 1.0], [-math.inf, -math.inf, -math.inf]])
    out = guard(None, bad)
    assert guard.tripped()
    assert torch.equal(out, torch.tensor([[0.0, 1.0, -math.inf], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]))
    guard(None, clean.clone())
    assert guard.tripped()  # once tripped, the call's rollout is thrown away


# ---------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------


def test_on_the_cpu_the_defaults_build_no_fast_sampler_and_change_nothing(small_policy):
    model, tokenizer = small_policy
    assert build_fast_sampler(model, tokenizer, GRPOConfig()) is None
    trainer = GRPOTrainer(model, tokenizer, reward, config(use_peft=True, lora_r=4))
    assert type(trainer.grpo_step.sampler) is PolicySampler  # the policy as it is, as before issue 43
    row = quiet(trainer.train_step, rows(4))
    assert not [key for key in row if key.startswith("sampler/")]


def test_the_fields_are_checked():
    with pytest.raises(ValueError, match=r"GRPOConfig.merge_adapters_for_sampling must be None or False with "
                                         r"use_peft=False, got True: there are no adapters to merge"):
        GRPOConfig(merge_adapters_for_sampling=True)
    with pytest.raises(TypeError, match=r"GRPOConfig.static_cache must be None, True or False, got 'on'"):
        GRPOConfig(static_cache="on")
    with pytest.raises(TypeError, match=r"GRPOConfig.merge_adapters_for_sampling must be None, True or False"):
        GRPOConfig(use_peft=True, merge_adapters_for_sampling=1)
    assert GRPOConfig(sampler="float16").sampler == "float16"
    assert GRPOConfig(use_peft=True, merge_adapters_for_sampling=False, static_cache=False).static_cache is False
