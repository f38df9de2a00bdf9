"""``make gpu-proof``: chapter 9's GPU path, measured on CUDA at Qwen2.5-0.5B's size under a T4's memory.

Chapter 9's Colab run cannot be executed by the book's build (no GPU), so its
settings rest on estimates. This script measures them wherever a CUDA GPU is
lent, in one call of about six minutes on an H100 (``--budget``: the sampler table
stops there), and writes one JSON record that chapter 9 prints
(``grpo_tutorial/data/gpu_proof.json``):

1. ``tests``: the CUDA unit tests (``tests/test_cuda.py``, skipped without a GPU, and
   ``tests/test_gpu_path.py``), in a pytest subprocess.
2. ``qwen_step``: the ``qwen2.5-0.5b-colab-t4`` preset on a model with Qwen2.5-0.5B's
   architecture (24 layers, hidden 896, 14 heads, 2 KV heads, vocabulary 151,936, tied
   embeddings; random weights in float32, gradient checkpointing on, as chapter 9
   trains it) and prompts of 150 synthetic token ids, with PyTorch's CUDA allocator
   capped at what a Colab T4 leaves it (:data:`T4_CAP_BYTES`). One warm-up step, one
   measured step and a checkpoint save; for each stage (generation with its KV
   cache, the scoring forward pass, backward, optimizer step, checkpoint save) the
   seconds and the peak allocated and reserved memory. Twice: full fine-tuning
   (``qwen2.5-0.5b-colab-t4-full``, mode ``full``, sampled by the plain model with
   the dynamic cache: ``sampler`` ``"plain"``) and LoRA adapters (the default
   preset, mode ``lora``, sampled as it samples on a GPU by default: from the
   merged copy with the static cache, ``"plain_static"``; the warm-up step pays the
   compile), each on a fresh model with the same weights.
3. ``tools_step`` (issue 54): chapter 16's run with the calculator on the GPU and
   the package's defaults (there the fast sampler, which pauses for each call): its
   warm start, then three steps, each timed (tool rollouts decode with the dynamic cache, since
   continuation rows grow: nothing compiles; the first step warms the GPU up).
4. ``tiny_recipe``: chapter 8's tiny recipe (warm start, GRPO, held-out accuracy
   before and after) for one seed, on the GPU.
5. ``qwen_step.samplers`` (issue 43): every sampler on the LoRA run's policy, at the
   preset's rows (8 prompts x 8) and prompt length, ``--sampler-tokens`` new tokens
   each (128: the shared rollout measurements of 2026-11-28 used the same), every
   completion to the budget: one first call (a static cache's compile), then
   ``--sampler-calls`` measured calls (median and range of the milliseconds per
   decoding step), the peak memory, and for the float16 copy its mismatch with
   the float32 policy (chapter 15's diagnostics) and its non-finite fallbacks. The
   samplers (``chapters.gsm8k.SAMPLER_LABELS``): ``plain_static`` (the GPU
   default), ``float16_static``, ``eval_plain_static`` (an evaluation batch:
   ``eval_batch_size`` rows, greedy), ``lora`` (unmerged, dynamic: every sampler
   before issue 43), ``plain``, ``eval_lora``, and TRL's ``generate`` settings where
   transformers has them: ``trl_static_no_compile`` (a static cache with
   ``disable_compile=True``, as TRL 1.16 builds its ``GenerationConfig``) and
   ``trl_continuous_batching`` (``generate_batch``). In that order, each started
   only while the proof is within ``--budget`` seconds; the rest say "skipped".

Without CUDA (or with ``--dry-run``) it runs the same code on the CPU with a tiny
stand-in model, the quick recipe and fewer tokens (and the LoRA mode's merged static
sampler switched on, which is off on a CPU by default), and writes a record of the
same shape (``tests/test_gpu_proof.py`` runs it in ``make test``)::

    make gpu-proof                                  # on a CUDA machine
    python -m benchmarks.gpu_proof --dry-run --out /tmp/gpu_proof.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks.common import ROOT  # noqa: E402
from grpo_tutorial.chapters.run_record import package_commit  # noqa: E402

DEFAULT_OUT = ROOT / "grpo_tutorial" / "data" / "gpu_proof.json"
DRY_RUN_OUT = ROOT / "runs" / "gpu_proof_dry_run.json"  # runs/ is not committed
PRESET = "qwen2.5-0.5b-colab-t4"  # LoRA adapters, the chapter's default
FULL_PRESET = "qwen2.5-0.5b-colab-t4-full"  # every weight trained
PROMPT_TOKENS = 150  # chapter 9's assumption for a GSM8K prompt with its system prompt and template
GiB = 2**30
#: The cap on this process's allocator: what a T4 leaves PyTorch (defined with chapter 9's other T4 figures).
from grpo_tutorial.chapters.gsm8k import T4_CAP_BYTES, T4_CONTEXT_BYTES, T4_TOTAL_BYTES  # noqa: E402,F401
from grpo_tutorial.chapters.gpu_estimates import stage_names  # noqa: E402
#: Qwen2.5-0.5B-Instruct's architecture (its config.json on the Hugging Face hub).
QWEN_ARCHITECTURE = dict(
    vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
    num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32_768,
    rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
)
#: The dry run's stand-in: the same model class, tiny.
TINY_ARCHITECTURE = dict(
    vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, rope_theta=1_000_000.0,
    rms_norm_eps=1e-6, tie_word_embeddings=True,
)
#: The stages of one step that the record measures: the watcher's names (metrics.watch_stages) -> the record's,
#: which are the history's timing keys less "_seconds" (records made before issue 44 named three otherwise:
#: grpo_tutorial.chapters.gpu_estimates.STAGES_BEFORE, through which the chapter reads them).
STAGES = {
    "sample": "sample", "reward": "reward", "forward_seconds": "forward",
    "backward_seconds": "backward", "optimizer_seconds": "optimizer",
}
CUDA_TESTS = ("tests/test_cuda.py", "tests/test_gpu_path.py")
#: What the tiny recipe took on an H100 (90 s in the record of 2026-11-28), kept free of the sampler table's budget.
TINY_RECIPE_SECONDS = 100.0
#: Kept free of the sampler table's budget for chapter 16's step with tools (its warm start included).
TOOLS_STEP_SECONDS = 60.0
#: Chapter 16's steps with tools, each timed (the first warms up; tool rollouts compile nothing).
TOOLS_STEPS = 3


def build_parser() -> argparse.ArgumentParser:
    """The command line; tests/test_records.py parses the record's command with it."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_proof",
        description="Chapter 9's GPU path on CUDA: the CUDA tests, one step of the T4 preset at "
        "Qwen2.5-0.5B's size under a T4's memory, and the tiny recipe learning; one JSON record.",
    )
    parser.add_argument("--out", type=Path, default=None,
                        help=f"the JSON record (default: {DEFAULT_OUT.relative_to(ROOT)} on a GPU, "
                        f"{DRY_RUN_OUT.relative_to(ROOT)} for a dry run)")
    parser.add_argument("--dry-run", action="store_true",
                        help="the CPU with a tiny stand-in (the default where CUDA is not available)")
    parser.add_argument("--tests", nargs="*", default=list(CUDA_TESTS), metavar="TEST",
                        help="pytest node ids to run first (default: %(default)s; none: skip)")
    parser.add_argument("--seed", type=int, default=0, help="the tiny recipe's seed (default: 0)")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="the step's completion budget (default: the preset's; the dry run's: 16)")
    parser.add_argument("--sampler-tokens", type=int, default=None,
                        help="new tokens of each sampler call (default: 128; the dry run's: 4)")
    parser.add_argument("--sampler-calls", type=int, default=3,
                        help="measured calls of each sampler, after its first (default: %(default)s)")
    parser.add_argument("--budget", type=float, default=360.0,
                        help="seconds: a sampler starts only while the proof has run less (default: %(default)s)")
    return parser


# ---------------------------------------------------------------------------
# What it runs on
# ---------------------------------------------------------------------------


def device_info(device: torch.device) -> dict[str, Any]:
    """The GPU (or the CPU of a dry run): name, driver, CUDA, memory."""
    info: dict[str, Any] = {"type": device.type, "name": None, "driver": None, "cuda": torch.version.cuda,
                            "capability": None, "multiprocessors": None, "total_bytes": None}
    if device.type != "cuda":
        from benchmarks.common import cpu_model

        info["name"] = cpu_model()
        return info
    props = torch.cuda.get_device_properties(device)
    info.update(name=props.name, capability=f"{props.major}.{props.minor}",
                multiprocessors=props.multi_processor_count, total_bytes=props.total_memory)
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
        info["driver"] = done.stdout.strip().splitlines()[0] if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    return info


def software() -> dict[str, Any]:
    import transformers

    versions: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                                "transformers": transformers.__version__}
    for name in ("peft", "tokenizers"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = None
    return versions


# ---------------------------------------------------------------------------
# 1. the CUDA unit tests
# ---------------------------------------------------------------------------


def run_tests(tests: list[str]) -> dict[str, Any]:
    """pytest on ``tests`` in a subprocess; the counts from its summary line."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    result: dict[str, Any] = {"command": " ".join(["python", *command[1:]]), "returncode": None, "passed": 0,
                              "failed": 0, "skipped": 0, "errors": 0, "seconds": 0.0, "summary": "not run"}
    if not tests:
        return result
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    result["seconds"] = time.perf_counter() - start
    result["returncode"] = done.returncode
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    result["summary"] = lines[-1].strip("= ") if lines else done.stderr[-500:]
    for count, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", result["summary"]):
        result["errors" if word.startswith("error") else word] = int(count)
    print(done.stdout[-4000:], flush=True)
    if done.returncode != 0:
        print(done.stderr[-4000:], file=sys.stderr, flush=True)
    return result


# ---------------------------------------------------------------------------
# 2. one step of the T4 preset at Qwen2.5-0.5B's size
# ---------------------------------------------------------------------------


def synthetic_tokenizer(vocab_size: int, eos_id: int, pad_id: int):
    """A tokenizer whose every id is one whitespace-separated word ``w<id>``: prompts of exact length."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=f"w{eos_id}", pad_token=f"w{pad_id}",
                                        unk_token="w0")
    tokenizer.padding_side = "left"
    return tokenizer


def synthetic_prompts(n: int, length: int, vocab_size: int, avoid: set[int], seed: int = 0) -> list[str]:
    """``n`` prompts of ``length`` random token ids (none of them special)."""
    generator = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(n):
        ids = torch.randint(3, vocab_size, (length,), generator=generator).tolist()
        prompts.append(" ".join(f"w{i if i not in avoid else 3}" for i in ids))
    return prompts


def odd_length_reward(completions, **kwargs) -> list[float]:
    """A reward that splits each group (the step must have advantages to backpropagate)."""
    return [float(len(c) % 2) for c in completions]


def sevens_reward(completions, **kwargs) -> list[float]:
    """The preset's second (format) reward's stand-in."""
    return [float(c.count("7") % 2) for c in completions]


class StagePeaks:
    """A :func:`~grpo_tutorial.metrics.watch_stages` watcher: each stage's peak CUDA memory.

    Each time a stage ends it reads the allocator's peak since the last stage ended
    and resets it, so each stage gets the peak reached while it ran.
    """

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.peaks: dict[str, dict[str, int | None]] = {}
        self.reset()

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def read(self, stage: str) -> None:
        peak = self.peaks.setdefault(stage, {"peak_allocated": None, "peak_reserved": None})
        if self.cuda:
            for key, value in (("peak_allocated", torch.cuda.max_memory_allocated()),
                               ("peak_reserved", torch.cuda.max_memory_reserved())):
                peak[key] = max(peak[key] or 0, value)
            torch.cuda.reset_peak_memory_stats()

    def __call__(self, name: str) -> None:
        self.read(STAGES.get(name, "other"))


def _synchronize(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def measure_step(trainer, batch: list[dict], cuda: bool) -> dict[str, Any]:
    """One training step: each stage's seconds (the history row's) and peak memory."""
    from grpo_tutorial.sampling.fast import COMPILE_SECONDS, DECODE_MS
    from grpo_tutorial.metrics import watch_stages

    from grpo_tutorial.warn import GRPOWarning

    peaks = StagePeaks(cuda)
    with watch_stages(peaks), warnings.catch_warnings():
        # random weights seldom write an EOS: completions run to the budget (the worst case, on purpose)
        warnings.filterwarnings("ignore", message=".*hit max_new_tokens", category=GRPOWarning)
        row = trainer.train_step(batch)
    seconds = {stage: row[f"{stage}_seconds"] for stage in STAGES.values()}
    stages = {stage: {"seconds": seconds[stage], **peaks.peaks.get(stage, {"peak_allocated": None,
                                                                          "peak_reserved": None})}
              for stage in STAGES.values()}
    allocated = [s["peak_allocated"] for s in stages.values() if s["peak_allocated"] is not None]
    reserved = [s["peak_reserved"] for s in stages.values() if s["peak_reserved"] is not None]
    return {
        "stages": stages,
        "step_seconds": row["step_seconds"],
        "peak_allocated": max(allocated) if allocated else None,
        "peak_reserved": max(reserved) if reserved else None,
        "completion_tokens_mean": row["completion_len_mean"],
        "truncated": row["frac_truncated"],
        "reward_mean": row["reward_mean"],
        "loss": row["loss"],
        "decode_ms": row.get(DECODE_MS),  # a fast sampler's (grpo_tutorial.sampling.fast); None for the plain generate
        "compile_seconds": row.get(COMPILE_SECONDS),
    }


def measure_checkpoint(trainer, cuda: bool) -> dict[str, Any]:
    """Save a checkpoint (weights, optimizer, run state) to a temporary folder: seconds, peaks, bytes."""
    peaks = StagePeaks(cuda)
    folder = Path(tempfile.mkdtemp(prefix="gpu-proof-checkpoint-"))
    try:
        _synchronize(cuda)
        start = time.perf_counter()
        path = trainer.save_checkpoint(folder)
        _synchronize(cuda)
        seconds = time.perf_counter() - start
        peaks.read("checkpoint_save")
        size = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"seconds": seconds, **peaks.peaks["checkpoint_save"], "bytes_on_disk": size}


def qwen_step(device: torch.device, *, dry_run: bool, max_new_tokens: int | None, samplers: dict) -> dict[str, Any]:
    """The T4 preset's step at Qwen2.5-0.5B's size (a tiny stand-in in a dry run): full fine-tuning, then LoRA.

    ``full`` is the full-weight preset (:data:`FULL_PRESET`), sampled by the plain
    model with the dynamic cache; ``lora`` the default one (:data:`PRESET`, LoRA
    adapters), sampled as on a GPU by default (merged copy, static cache; switched
    on in a dry run); both at the same shapes, each on a fresh model with the same
    random weights. After LoRA's steps its policy measures the sampler table
    (:func:`measure_samplers`, with ``samplers``: ``tokens``, ``calls``,
    ``started`` and ``budget``).
    """
    from grpo_tutorial.chapters.gsm8k import gpu_sampler
    from grpo_tutorial.presets import get_preset

    cuda = device.type == "cuda"
    architecture = TINY_ARCHITECTURE if dry_run else QWEN_ARCHITECTURE
    budget = max_new_tokens or (16 if dry_run else None)
    overrides = dict(use_chat_template=False, system_prompt=None, log_completions=False, seed=0)
    if budget is not None:
        overrides["max_new_tokens"] = budget
    configs = {"full": get_preset(FULL_PRESET, static_cache=False, **overrides),
               "lora": get_preset(PRESET, **overrides, **(dict(static_cache=True, merge_adapters_for_sampling=True)
                                                            if dry_run else {}))}
    config = configs["lora"]
    shapes = {"prompts": config.prompts_per_step, "group_size": config.group_size,
              "completions": config.prompts_per_step * config.group_size, "prompt_tokens": PROMPT_TOKENS,
              "max_new_tokens": config.max_new_tokens, "micro_batch_size": config.micro_batch_size}
    out: dict[str, Any] = {"preset": PRESET, "full_preset": FULL_PRESET, "shapes": shapes, "modes": {}}
    for mode, mode_config in configs.items():
        then = (lambda trainer, prompts: measure_samplers(trainer, prompts, cuda=cuda, **samplers)) if mode == "lora" \
            else None
        out["modes"][mode], out["model"], table = _measure_mode(device, architecture, mode_config, cuda, mode, then)
        out["modes"][mode]["sampler"] = gpu_sampler(mode_config)
        if table is not None:
            out["samplers"] = table
    out.setdefault("samplers", {})
    return out


def _measure_mode(device: torch.device, architecture: dict, config, cuda: bool, mode: str,
                  then: Callable | None = None) -> tuple[dict, dict, Any]:
    """Two steps (a warm-up and the measured one) and a checkpoint save of ``config`` on a fresh random model;
    then ``then(trainer, prompts)``'s result (None without it)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_tutorial.chapters.gsm8k import enable_gradient_checkpointing
    from grpo_tutorial.trainer import GRPOTrainer

    vocab = architecture["vocab_size"]
    eos_id, pad_id = (151_645, 151_643) if vocab > 1000 else (vocab - 1, vocab - 2)  # Qwen's <|im_end|>, <|endoftext|>
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(Qwen2Config(**architecture, eos_token_id=eos_id, pad_token_id=pad_id))
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    enable_gradient_checkpointing(model)
    about = {"architecture": architecture, "parameters": sum(p.numel() for p in model.parameters()),
             "dtype": str(model.dtype).replace("torch.", ""), "gradient_checkpointing": True,
             "weights": "random (the architecture's memory and time, not its answers)"}
    tokenizer = synthetic_tokenizer(vocab, eos_id, pad_id)
    prompts = synthetic_prompts(config.prompts_per_step, PROMPT_TOKENS, vocab, {eos_id, pad_id})
    batch = [{"prompt": p, "answer": "0"} for p in prompts]
    result: dict[str, Any] = {"status": "measured", "error": None}
    trainer, table = None, None
    try:
        trainer = GRPOTrainer(model, tokenizer, [odd_length_reward, sevens_reward], config)
        result["trainable_parameters"] = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        print(f"qwen_step ({mode}): {about['parameters']:,} parameters on {device}; warm-up step", flush=True)
        result["warmup_step"] = measure_step(trainer, batch, cuda)
        print(f"qwen_step ({mode}): measured step", flush=True)
        result["step"] = measure_step(trainer, batch, cuda)
        # between steps: the weights, their gradients (freed at the next update's start) and Adam's moments
        result["state_bytes"] = torch.cuda.memory_allocated() if cuda else None
        print(f"qwen_step ({mode}): checkpoint save", flush=True)
        result["checkpoint"] = measure_checkpoint(trainer, cuda)
    except torch.OutOfMemoryError as error:  # a finding, not a crash: the record says where
        result.update(status="out of memory", error=str(error)[:2000])
    if then is not None:
        table = then(trainer, prompts) if trainer is not None and result["status"] == "measured" else {}
    del trainer, model
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return result, about, table


# ---------------------------------------------------------------------------
# 2b. every sampler, on the LoRA run's policy (issue 43)
# ---------------------------------------------------------------------------

#: The sampler table's rows, in the order they are measured (and skipped once the budget is spent).
SAMPLERS = ("plain_static", "float16_static", "eval_plain_static", "lora", "plain", "eval_lora",
            "trl_static_no_compile", "trl_continuous_batching")


def measure_samplers(trainer, prompts: list[str], *, cuda: bool, tokens: int, calls: int, started: float,
                     budget: float) -> dict[str, Any]:
    """Each sampler of :data:`SAMPLERS` on ``trainer``'s LoRA policy: ms per decoding step, compile, memory.

    The policy is the PEFT model; the merged float32 copy is the trainer's own fast
    sampler's model when it has one; the float16 copy is made here. Every completion
    runs to ``tokens`` (the stop tokens suppressed). Each sampler's first call pays
    its compile and warm-up; ``calls`` more are measured. A sampler starts only while
    ``time.perf_counter() - started < budget``.
    """
    from grpo_tutorial.sampling.fast import has_adapters, merged_copy

    policy, tokenizer, config = trainer.model, trainer.tokenizer, trainer.config
    merged = trainer.grpo_step.sampler.evaluation_model  # the default sampler's merged copy, where it has one
    merged = merged if not has_adapters(merged) else merged_copy(policy)
    table: dict[str, Any] = {}
    for name in SAMPLERS:
        if time.perf_counter() - started > budget:
            table[name] = {"status": "skipped", "error": f"the proof's time budget of {budget:.0f} s was spent"}
            continue
        print(f"samplers: {name}", flush=True)
        try:
            table[name] = _measure_one(name, policy, merged, tokenizer, config, prompts, cuda=cuda, tokens=tokens,
                                       calls=calls)
        except torch.OutOfMemoryError as error:
            table[name] = {"status": "out of memory", "error": str(error)[:1000]}
        except Exception as error:  # noqa: BLE001: a sampler transformers cannot run here is a finding, not a crash
            table[name] = {"status": "error", "error": f"{type(error).__name__}: {str(error)[:1000]}"}
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return table


def _measure_one(name: str, policy, merged, tokenizer, config, prompts: list[str], *, cuda: bool, tokens: int,
                 calls: int) -> dict[str, Any]:
    """One row of the sampler table (see :func:`measure_samplers`)."""
    import statistics

    from benchmarks.rollout import NoStopTokens
    from grpo_tutorial.sampling.fast import NonFiniteGuard, merged_copy
    from grpo_tutorial.logprobs import score_rollout
    from grpo_tutorial.mismatch import mismatch_diagnostics
    from grpo_tutorial.rollout import generate_rollouts, stop_token_ids

    evaluation = name.startswith("eval_")
    kind = name.removeprefix("eval_")
    rows = config.eval_batch_size if evaluation else len(prompts) * config.group_size
    group = 1 if evaluation else config.group_size
    batch = (prompts * -(-rows // len(prompts)))[:rows] if evaluation else prompts
    model = {"lora": policy, "float16_static": None}.get(kind, merged)
    if kind == "float16_static":
        model = merged_copy(policy, torch.float16)
    static = kind.endswith("_static") or kind == "trl_static_no_compile"
    no_stop = NoStopTokens(stop_token_ids(model, tokenizer))
    guard = NonFiniteGuard() if kind.startswith("float16") else None
    if kind == "trl_continuous_batching":
        return _continuous_batching(merged, tokenizer, batch, group, tokens, calls, cuda)
    before = model.generation_config.disable_compile
    model.generation_config.disable_compile = kind == "trl_static_no_compile" or None
    seconds, rollout = [], None
    peaks = StagePeaks(cuda)
    try:
        for seed in range(calls + 1):
            _synchronize(cuda)
            start = time.perf_counter()
            rollout = generate_rollouts(model, tokenizer, batch, group_size=group, max_new_tokens=tokens,
                                        do_sample=not evaluation, generator_seed=seed, static_cache=static,
                                        logits_processor=(no_stop,) + ((guard,) if guard else ()))
            _synchronize(cuda)
            seconds.append(time.perf_counter() - start)
            if rollout.completion_ids.shape[1] != tokens:
                raise RuntimeError(f"{name}: {rollout.completion_ids.shape[1]} tokens generated, not {tokens}")
        peaks.read("sampler")
    finally:
        model.generation_config.disable_compile = before
    first, measured = seconds[0], seconds[1:]
    ms = [1000 * s / tokens for s in measured]
    row: dict[str, Any] = {
        "status": "measured", "error": None, "label": kind, "prompts": len(batch), "group_size": group,
        "rows": len(batch) * group, "prompt_tokens": PROMPT_TOKENS, "new_tokens": tokens, "greedy": evaluation,
        "static_cache": static, "dtype": str(model.dtype).replace("torch.", ""), "calls_seconds": seconds,
        "ms_per_step": {"median": statistics.median(ms), "min": min(ms), "max": max(ms), "n": len(ms)},
        "first_call_seconds": first,
        "compile_seconds": max(0.0, first - statistics.median(measured)) if static else None,
        **peaks.peaks["sampler"],
    }
    if guard is not None:  # the float16 copy: its mismatch with the float32 policy on its own last sample
        sampler_logp = score_rollout(model, rollout, temperature=config.temperature, chunk=config.micro_size)
        learner_logp = score_rollout(policy, rollout, temperature=config.temperature, chunk=config.micro_size)
        row["fallbacks"] = int(guard.tripped() or not bool(torch.isfinite(sampler_logp).all()))
        row["mismatch"] = mismatch_diagnostics(learner_logp.float(), sampler_logp.float(), rollout.completion_mask)
    return row


def _continuous_batching(model, tokenizer, prompts: list[str], group: int, tokens: int, calls: int,
                         cuda: bool) -> dict[str, Any]:
    """transformers' continuous batching (``generate_batch``, TRL's ``use_transformers_continuous_batching``)."""
    import statistics

    from transformers import GenerationConfig

    if not hasattr(model, "generate_batch"):
        return {"status": "not available", "error": "this transformers has no generate_batch"}
    if not cuda:  # its paged cache on a CPU took about 19 s for 4 tokens of the dry run's 64 rows
        return {"status": "not available", "error": "continuous batching is measured on CUDA only"}
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts for _ in range(group)]
    settings = GenerationConfig(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=True, temperature=1.0,
                                top_k=0, top_p=1.0, eos_token_id=model.generation_config.eos_token_id,
                                pad_token_id=model.generation_config.pad_token_id)
    seconds, generated = [], 0
    for _ in range(calls + 1):
        _synchronize(cuda)
        start = time.perf_counter()
        outputs = model.generate_batch(inputs=ids, generation_config=settings)
        _synchronize(cuda)
        seconds.append(time.perf_counter() - start)
        generated = max(len(getattr(o, "generated_tokens", []) or []) for o in outputs.values())
    ms = [1000 * s / max(1, generated) for s in seconds[1:]]
    return {"status": "measured", "error": None, "label": "trl_continuous_batching", "rows": len(ids),
            "prompt_tokens": PROMPT_TOKENS, "new_tokens": generated, "greedy": False, "calls_seconds": seconds,
            "ms_per_step": {"median": statistics.median(ms), "min": min(ms), "max": max(ms), "n": len(ms)},
            "first_call_seconds": seconds[0], "compile_seconds": None}


# ---------------------------------------------------------------------------
# 3. chapter 16's run with tools, on the device with the package's defaults
# ---------------------------------------------------------------------------


def tools_step(device: torch.device, *, dry_run: bool) -> dict[str, Any]:
    """Chapter 16's GRPO run with the calculator on ``device``, every setting the recipe's (issue 54).

    On CUDA the defaults resolve to the fast sampler (``static_cache=None`` turns the
    static cache on there), which must pause for each tool call: the steps below are that
    path's first run on a GPU. The warm start (chapter 16's, to the recipe's target) runs
    on the device first, so the model calls the tool. A dry run skips the warm start and
    forces the CUDA default (``static_cache=True``) on the CPU. Then :data:`TOOLS_STEPS`
    steps, each timed. Tool rollouts decode with the dynamic cache even where the static one is on
    (continuation rows grow in width, and each width would compile anew), so nothing compiles here.
    """
    from grpo_tutorial import GRPOTrainer
    from grpo_tutorial.tools.calculator import calculator
    from grpo_tutorial.chapters import tool_use
    from grpo_tutorial.sampling.fast import COMPILE_SECONDS, DECODE_MS

    recipe = tool_use.ToolRecipe()
    data = tool_use.make_tool_data(recipe)
    changes = {"static_cache": True} if dry_run else {}  # the CUDA default, forced on the CPU
    config = recipe.grpo_config(seed=0, **changes)
    model, tokenizer = tool_use.build_tool_model(recipe, seed=0)
    model.to(device)
    print(f"tools_step: chapter 16's recipe on {device}", flush=True)
    warm = None
    if not dry_run:
        info = tool_use.warm_start(model, tokenizer, data, recipe, seed=0, progress=False, cache="")
        warm = {"steps": info["steps"], "seconds": info["seconds"], "reached": info["reached"],
                "probe_last": info["probe"][-1] if info["probe"] else None}
    trainer = GRPOTrainer(model, tokenizer, [tool_use.tool_answer_reward], config,
                          accuracy_fn=tool_use.tool_answer_reward, tools=[calculator])
    sampler = trainer.grpo_step.sampler
    steps = []
    size = config.prompts_per_step
    for i in range(TOOLS_STEPS):
        batch = data["train"][i * size:(i + 1) * size]
        _synchronize(device.type == "cuda")
        row = trainer.train_step(batch)
        steps.append({
            "step_seconds": row["step_seconds"], "sample_seconds": row["sample_seconds"],
            "tool_call_share": row["tool_call_share"], "tool_call_count": row["tool_call_count"],
            "tool_failure_count": row["tool_failure_count"], "reward_mean": row["reward_mean"],
            "completion_len_mean": row["completion_len_mean"], "decode_ms": row.get(DECODE_MS),
            "compile_seconds": row.get(COMPILE_SECONDS),
        })
    return {
        "recipe": "chapter 16's ToolRecipe(), seed 0",
        "config_changes": changes,
        "static_cache": config.static_cache,
        "sampler": type(sampler).__name__,
        "rows": size * config.group_size,
        "warm_start": warm,
        "steps": steps,
    }


# ---------------------------------------------------------------------------
# 4. the tiny recipe learning
# ---------------------------------------------------------------------------


def tiny_recipe(device: torch.device, seed: int, *, dry_run: bool) -> dict[str, Any]:
    """Chapter 8's recipe (the quick one in a dry run) for one seed on ``device``."""
    from grpo_tutorial.chapters.recipes import TinyAdditionRecipe, run_tiny_addition

    recipe = TinyAdditionRecipe.quick() if dry_run else TinyAdditionRecipe()
    print(f"tiny_recipe: seed {seed} on {device} ({'quick' if dry_run else 'default'} recipe)", flush=True)
    result = run_tiny_addition(recipe, seed=seed, progress=False, device=device)
    history = result["history"]
    return {
        "recipe": "quick" if dry_run else "default",
        "seed": seed,
        "grpo_steps": len(history),
        "warm_start_steps": result["warm_start"]["steps"],
        "before": result["before"]["accuracy"],
        "after": result["after"]["accuracy"],
        "n": result["after"]["n"],
        "gain": result["gain"],
        "gain_se": result["gain_se"],
        "seconds": {k: result["seconds"][k] for k in ("warm_start", "grpo", "eval", "total")},
        "reward_first_last": [history[0]["reward_mean"], history[-1]["reward_mean"]] if history else None,
    }


# ---------------------------------------------------------------------------
# The record
# ---------------------------------------------------------------------------


def run(args: argparse.Namespace, argv: list[str], out: Path) -> dict[str, Any]:
    from grpo_tutorial.models import use_expandable_segments

    # at the start: the code that runs. A copy of a working tree sent to a lent GPU may carry a stale .git
    # (or none): there the caller names the commit it sent, committed and clean, in GPU_PROOF_COMMIT.
    sent = os.environ.get("GPU_PROOF_COMMIT")
    code = {"package_commit": sent, "package_dirty": False} if sent else package_commit()
    started = time.perf_counter()
    dry_run = args.dry_run or not torch.cuda.is_available()
    cap: dict[str, Any] = {"bytes": None, "fraction": None,
                           "why": "a Colab T4's 14.56 GiB as PyTorch reports it, less half a GiB of CUDA context"}
    allocator = None
    if not dry_run:
        allocator = use_expandable_segments()  # what chapter 9 does before the first CUDA allocation
        device = torch.device("cuda", torch.cuda.current_device())  # set_per_process_memory_fraction needs the index
        total = torch.cuda.get_device_properties(device).total_memory
        fraction = T4_CAP_BYTES / total
        torch.cuda.set_per_process_memory_fraction(fraction, device)
        cap.update(bytes=T4_CAP_BYTES, fraction=fraction)
    else:
        device = torch.device("cpu")
    record: dict[str, Any] = {
        "what": "chapter 9's GPU path: the CUDA tests, one step of the qwen2.5-0.5b-colab-t4 preset at "
        "Qwen2.5-0.5B's size under a T4's memory cap, and the tiny recipe learning",
        "command": " ".join(["python -m benchmarks.gpu_proof", *map(shlex.quote, argv)]),  # make gpu-proof runs it
        **code,
        "dry_run": dry_run,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device_info(device),
        "software": software(),
        "allocator": allocator,
        "memory_cap": cap,
    }
    parts: dict[str, Callable[[], dict[str, Any]]] = {
        "tests": lambda: run_tests(args.tests),
        "qwen_step": lambda: qwen_step(device, dry_run=dry_run, max_new_tokens=args.max_new_tokens, samplers=dict(
            tokens=args.sampler_tokens or (4 if dry_run else 128), calls=args.sampler_calls, started=started,
            budget=args.budget - (0 if dry_run else TINY_RECIPE_SECONDS + TOOLS_STEP_SECONDS))),
        "tools_step": lambda: tools_step(device, dry_run=dry_run),
        "tiny_recipe": lambda: tiny_recipe(device, args.seed, dry_run=dry_run),
    }
    for name, part in parts.items():
        record[name] = part()
        record["seconds"] = time.perf_counter() - started
        write_record(record, out)  # after each part: a run stopped by a time limit keeps what it measured
    return record


def write_record(record: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, out)


def summary_lines(record: dict[str, Any]) -> list[str]:
    """The record in a few lines (the script prints them last; chapter 9 prints its own)."""
    lines = [f"{record['device']['name']} ({'dry run' if record['dry_run'] else 'CUDA'}), "
             f"torch {record['software']['torch']}, {record['seconds']:.0f} s in all"]
    tests = record["tests"]
    lines.append(f"tests: {tests['summary']} (exit {tests['returncode']})")
    full = record["qwen_step"]["modes"]["full"]
    lines.append(f"qwen step, full fine-tuning: {full['status']}")
    if full["status"] == "measured":
        gib = (lambda b: "-" if b is None else f"{b / GiB:6.2f}")
        for stage, s in {**stage_names(full["step"])["stages"], "checkpoint_save": full["checkpoint"]}.items():
            lines.append(f"  {stage:<16} {s['seconds']:7.2f} s  peak allocated {gib(s['peak_allocated'])} GiB, "
                         f"reserved {gib(s['peak_reserved'])} GiB")
        lines.append(f"  step {full['step']['step_seconds']:.2f} s, cap {gib(record['memory_cap']['bytes'])} GiB")
    lora = record["qwen_step"]["modes"].get("lora", {})
    if lora.get("status") == "measured":
        step = stage_names(lora["step"])
        lines.append(f"qwen step, LoRA ({lora.get('sampler', 'lora')}): {step['step_seconds']:.2f} s, generation "
                     f"{step['stages']['sample']['seconds']:.2f} s, peak reserved "
                     f"{(step['peak_reserved'] or 0) / GiB:.2f} GiB")
    for name, row in record["qwen_step"].get("samplers", {}).items():
        if row.get("status") == "measured":
            ms = row["ms_per_step"]
            first = f", compile {row['compile_seconds']:.1f} s" if row.get("compile_seconds") is not None else ""
            lines.append(f"  sampler {name:<24} {ms['median']:7.2f} ms/step [{ms['min']:.2f}, {ms['max']:.2f}], "
                         f"{row['rows']} rows{first}")
        else:
            lines.append(f"  sampler {name:<24} {row.get('status')}: {str(row.get('error'))[:100]}")
    tools = record.get("tools_step")  # records made before issue 54 have none
    if tools is not None:
        lines.append(f"chapter 16 with tools: sampler {tools['sampler']}, static cache {tools['static_cache']}, "
                     f"{tools['rows']} rows; steps " + ", ".join(
                         f"{s['step_seconds']:.2f} s (sampling {s['sample_seconds']:.2f} s, "
                         f"calls {s['tool_call_share']:.0%})" for s in tools["steps"]))
    tiny = record["tiny_recipe"]
    lines.append(f"tiny recipe seed {tiny['seed']}: {tiny['before']:.3f} -> {tiny['after']:.3f} "
                 f"({tiny['gain']:+.3f} ± {tiny['gain_se']:.3f}), GRPO {tiny['seconds']['grpo']:.0f} s")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    dry_run = args.dry_run or not torch.cuda.is_available()
    out = args.out or (DRY_RUN_OUT if dry_run else DEFAULT_OUT)  # a dry run never overwrites the committed record
    record = run(args, argv, out)
    print("\n".join(summary_lines(record)))
    print(f"wrote {out}")
    failed = record["tests"]["returncode"] not in (0, None) or record["qwen_step"]["modes"]["full"]["status"] != "measured"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
