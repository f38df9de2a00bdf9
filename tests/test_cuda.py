"""The package on a real CUDA GPU: what only a GPU can show.

Every test here is skipped without CUDA (``make test`` hides the GPU on purpose);
``make gpu-proof`` runs them on a lent GPU (``benchmarks/gpu_proof.py``) and its
record holds the counts. ``tests/test_gpu_path.py`` checks the GPU-only branches on
the CPU with CUDA stubbed.

What they show: the scorer on the GPU agrees with a float64 reference on the CPU;
seeded sampling on the GPU repeats itself and leaves the caller's CUDA RNG alone; a
training step there is on-policy (ratio 1) and moves the weights; a run interrupted
on the GPU resumes to the uninterrupted run's history, and its checkpoint loads on a
CPU; each stage's clock waits for the GPU's kernels; the dtype picked for the GPU
found here is the one its hardware runs natively. Issue 43's fast sampler: the static
cache's compiled step samples from the dynamic cache's logits and is compiled once, and
a float16 sampler copy's step keeps the learner in float32.
"""

from __future__ import annotations

import copy

import pytest
import torch

from grpo_tutorial import GRPOConfig, GRPOTrainer
from grpo_tutorial.logprobs import completion_logprobs, score_rollout
from grpo_tutorial.metrics import watch_stages
from grpo_tutorial.models import generation_dtype, native_bf16_supported, pick_device_and_dtype
from grpo_tutorial.rollout import generate_rollouts
from grpo_tutorial.run.checkpoint import load_model_state
from helpers import tiny_model

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-proof runs these)"),
    pytest.mark.filterwarnings("ignore:.*hit max_new_tokens"),  # a 6-token budget, on purpose
]

CUDA = torch.device("cuda")
PROMPTS = ["12+7=", "3+45=", "60+9=", "8+8="]
ROWS = [{"prompt": p, "answer": str(eval(p[:-1]))} for p in PROMPTS]


def reward(completions, **kwargs) -> list[float]:
    return [float(len(c) % 3 == 0) for c in completions]


def tiny_on_gpu(seed: int = 0):
    model, tokenizer = tiny_model(seed=seed)
    return model.to(CUDA), tokenizer


def config(**overrides) -> GRPOConfig:
    """The tests' settings. The static cache (on by default on a GPU, issue 43) is off unless a test asks: each
    compile costs seconds of ``make gpu-proof``'s few minutes, and the fast sampler's own tests are below."""
    return GRPOConfig(**{"group_size": 4, "prompts_per_step": 4, "max_new_tokens": 6, "seed": 0,
                         "static_cache": False, **overrides})


@pytest.fixture(autouse=True)
def exact_float32():
    """float32 products in float32 (no TF32), whatever the caller set."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def test_scoring_on_the_gpu_matches_a_float64_reference_on_the_cpu():
    model, tokenizer = tiny_on_gpu()
    rollout = generate_rollouts(model, tokenizer, PROMPTS, group_size=4, max_new_tokens=6, generator_seed=0)
    assert rollout.completion_ids.device.type == "cuda"
    logp = score_rollout(model, rollout)  # [N, Tc], the trainer's scoring pass
    reference = copy.deepcopy(model).to("cpu", torch.float64)
    ids, attention = rollout.input_ids.cpu(), rollout.attention_mask.cpu()  # [N, Tp + Tc] x2
    Tc = rollout.completion_ids.shape[1]
    expected = completion_logprobs(reference, ids, attention, Tc)  # [N, Tc] in float64
    mask = rollout.completion_mask.cpu().bool()
    assert expected.dtype == torch.float64 and mask.any()
    error = (logp.double().cpu() - expected)[mask].abs().max()
    assert error < 1e-4, f"float32 on the GPU vs float64 on the CPU: {error:.2e}"


def test_seeded_sampling_on_the_gpu_repeats_and_leaves_the_cuda_rng_alone():
    model, tokenizer = tiny_on_gpu()
    torch.cuda.manual_seed(123)
    state = torch.cuda.get_rng_state()
    first = generate_rollouts(model, tokenizer, PROMPTS, group_size=4, max_new_tokens=6, generator_seed=7)
    second = generate_rollouts(model, tokenizer, PROMPTS, group_size=4, max_new_tokens=6, generator_seed=7)
    other = generate_rollouts(model, tokenizer, PROMPTS, group_size=4, max_new_tokens=6, generator_seed=8)
    assert torch.equal(first.completion_ids, second.completion_ids)
    assert not torch.equal(first.completion_ids, other.completion_ids)
    assert torch.equal(torch.cuda.get_rng_state(), state)


def test_a_training_step_on_the_gpu_is_on_policy_and_moves_the_weights():
    model, tokenizer = tiny_on_gpu()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = GRPOTrainer(model, tokenizer, reward, config())
    row = trainer.train_step(ROWS)
    assert row["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and row["clip_frac"] == 0.0
    assert all(p.device.type == "cuda" for p in model.parameters())
    moved = sum(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert moved > 0 and row["frac_zero_std"] < 1.0


def test_each_stage_s_clock_waits_for_the_gpu():
    """A stage ends when its kernels do: at every watcher call, nothing is left queued on the GPU."""
    model, tokenizer = tiny_on_gpu()
    trainer = GRPOTrainer(model, tokenizer, reward, config(micro_batch_size=8))
    idle: list[bool] = []
    stream = torch.cuda.current_stream()
    with watch_stages(lambda name: idle.append(stream.query())):
        trainer.train_step(ROWS)
    assert len(idle) >= 7 and all(idle)


def test_a_run_interrupted_on_the_gpu_resumes_to_the_same_history_and_loads_on_a_cpu(tmp_path, make_tiny_policy):
    def run(out, steps, resume=False):
        model, tokenizer = tiny_on_gpu()
        trainer = GRPOTrainer(model, tokenizer, reward, config(checkpoint_every=1, output_dir=str(out)))
        trainer.train(ROWS * 4, steps, resume=resume, progress=False)
        return trainer

    whole = run(tmp_path / "whole", 3)
    run(tmp_path / "cut", 2)
    resumed = run(tmp_path / "cut", 3, resume=True)
    for a, b in zip(whole.history, resumed.history):
        assert a["reward_mean"] == b["reward_mean"]  # the same samples
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    cpu_model, _ = make_tiny_policy(seed=1)
    meta = load_model_state(cpu_model, tmp_path / "cut")
    assert meta["step"] == 3
    for p, q in zip(cpu_model.parameters(), resumed.model.parameters()):
        assert torch.equal(p, q.detach().cpu())


def test_the_dtype_picked_for_this_gpu_is_native():
    device, dtype = pick_device_and_dtype()
    assert device.type == "cuda"
    assert dtype == torch.float32  # the weights train (issue 33); 16-bit only to generate
    major, _ = torch.cuda.get_device_capability()
    assert native_bf16_supported() == (major >= 8)
    assert generation_dtype() == (torch.bfloat16 if major >= 8 else torch.float16)


class Recorder:
    """A logits processor that keeps a copy of every step's scores."""

    def __init__(self):
        self.scores = []

    def __call__(self, input_ids, scores):
        self.scores.append(scores.detach().float().clone())
        return scores


def test_the_static_cache_compiles_once_and_samples_from_the_dynamic_caches_logits():
    from grpo_tutorial.sampling.fast import COMPILE_SECONDS, DECODE_MS, FastSampler

    model, tokenizer = tiny_on_gpu()
    fast = FastSampler(model, tokenizer, config(), merge=False, static=True)
    first, second = fast(PROMPTS, 0), fast(PROMPTS, 1)
    assert first.sampler_stats[COMPILE_SECONDS] > 0 and second.sampler_stats[COMPILE_SECONDS] < 1e-9
    assert second.sampler_stats[DECODE_MS] < first.sampler_stats[DECODE_MS]  # the compile was paid once
    scores = {}
    for static in (False, True):
        recorder = Recorder()
        generate_rollouts(model, tokenizer, PROMPTS, group_size=4, max_new_tokens=6, generator_seed=1,
                          static_cache=static, logits_processor=(recorder,))
        scores[static] = recorder.scores
    for a, b in zip(scores[False], scores[True]):
        assert (a - b).abs().max() < 1e-3  # float32 logits of order 1, other kernels (TF32 off)


def test_a_float16_sampler_step_keeps_the_learner_in_float32_and_reports_its_mismatch():
    pytest.importorskip("peft")
    from grpo_tutorial.sampling.fast import FALLBACKS

    model, tokenizer = tiny_on_gpu()
    trainer = GRPOTrainer(model, tokenizer, reward, config(sampler="float16", use_peft=True, lora_r=4))
    assert trainer.grpo_step.sampler.model.dtype == torch.float16
    row = trainer.train_step(ROWS)
    assert row[FALLBACKS] < 1 and row["mismatch/kl"] < 1e-2 and row["mismatch/ess"] > 0.9
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
