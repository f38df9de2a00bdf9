"""``make gpu-proof`` (benchmarks/gpu_proof.py): its dry run, the record it committed, and the T4 scaling.

The script runs on a lent CUDA GPU, which CI never has; here it runs as a dry run
on the CPU with a tiny stand-in and must write a record of exactly the committed
record's shape. The committed record (made on a GPU) is checked for what chapter
9 reads from it: every stage under the T4-sized cap, the tests passed, the tiny
recipe learned.
"""

from __future__ import annotations

import copy
import json
import re
import shlex

import pytest

from benchmarks import gpu_proof
from grpo_tutorial.chapters.gsm8k import (
    GPU_PEAKS,
    T4_BANDWIDTH,
    T4_FP32_FLOPS,
    lora_trainable_params,
    published_peaks,
    t4_step_estimate,
)
from grpo_tutorial.data import read_data
from grpo_tutorial.presets import get_preset

CHEAP_TEST = "tests/test_gpu_path.py::test_a_t4_generates_in_float16_not_emulated_bfloat16"


def shape(value):
    """A record's key tree: dicts by their keys, every leaf as None."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    return None


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-proof") / "record.json"
    assert gpu_proof.main(["--dry-run", "--out", str(out), "--tests", CHEAP_TEST]) == 0
    return json.loads(out.read_text())


def test_the_dry_run_writes_every_field_of_the_committed_record(dry_run):
    committed = read_data("gpu_proof.json")
    wanted = shape(dry_run)
    if committed["qwen_step"]["modes"]["lora"]["status"] == "not measured":
        # made before the script measured LoRA (no GPU has been lent since): every other field must match
        assert "full_preset" not in committed["qwen_step"]
        del wanted["qwen_step"]["full_preset"], wanted["qwen_step"]["modes"]["lora"]
        got = shape(committed)
        del got["qwen_step"]["modes"]["lora"]
        assert got == wanted
    else:
        assert shape(committed) == wanted
    assert dry_run["dry_run"] is True and dry_run["device"]["type"] == "cpu"
    assert dry_run["command"].startswith("python -m benchmarks.gpu_proof --dry-run --out ")


def test_the_dry_run_measures_every_stage_it_can_on_a_cpu(dry_run):
    assert dry_run["tests"]["passed"] == 1 and dry_run["tests"]["returncode"] == 0
    full = dry_run["qwen_step"]["modes"]["full"]
    assert full["status"] == "measured" and full["error"] is None
    for step in (full["warmup_step"], full["step"]):
        assert set(step["stages"]) == set(gpu_proof.STAGES.values())
        assert all(s["seconds"] >= 0 for s in step["stages"].values())
        assert step["stages"]["generation"]["seconds"] > 0 and step["stages"]["backward"]["seconds"] > 0
        assert all(s["peak_allocated"] is None for s in step["stages"].values())  # no CUDA allocator on a CPU
    assert full["checkpoint"]["bytes_on_disk"] > 12 * full["trainable_parameters"]  # float32 weights + Adam's 2 moments
    lora = dry_run["qwen_step"]["modes"]["lora"]
    assert lora["status"] == "measured" and shape(lora) == shape(full)  # the same fields, measured the same way
    # the adapters only, as many as chapter 9's estimate counts (PEFT's own count, checked against the formula)
    architecture = dry_run["qwen_step"]["model"]["architecture"]
    assert lora["trainable_parameters"] == lora_trainable_params(architecture, get_preset(gpu_proof.PRESET).lora_r)
    # a LoRA checkpoint holds the adapters and their moments, and not the base
    assert 12 * lora["trainable_parameters"] < lora["checkpoint"]["bytes_on_disk"]
    assert lora["checkpoint"]["bytes_on_disk"] < 12 * lora["trainable_parameters"] + 4 * full["trainable_parameters"]
    tiny = dry_run["tiny_recipe"]
    assert tiny["recipe"] == "quick" and tiny["grpo_steps"] > 0 and 0 <= tiny["after"] <= 1


def test_the_committed_record_was_made_on_a_gpu_and_fits_a_t4(dry_run):
    record = read_data("gpu_proof.json")
    assert record["dry_run"] is False and record["device"]["type"] == "cuda"
    assert re.fullmatch(r"[0-9a-f]{40}", record["package_commit"]) and record["package_dirty"] is False
    gpu_proof.build_parser().parse_args(shlex.split(record["command"])[3:])  # its command parses
    assert record["tests"]["failed"] == 0 and record["tests"]["errors"] == 0 and record["tests"]["passed"] > 0
    cap = record["memory_cap"]["bytes"]
    assert cap == gpu_proof.T4_CAP_BYTES
    full = record["qwen_step"]["modes"]["full"]
    assert full["status"] == "measured"
    assert record["qwen_step"]["model"]["architecture"] == gpu_proof.QWEN_ARCHITECTURE
    assert record["qwen_step"]["shapes"]["max_new_tokens"] == 256 and full["step"]["completion_tokens_mean"] == 256
    for stage in [*full["step"]["stages"].values(), full["checkpoint"]]:
        assert stage["peak_allocated"] <= stage["peak_reserved"] <= cap
    assert full["checkpoint"]["bytes_on_disk"] > 12 * full["trainable_parameters"]  # float32 weights + Adam
    assert record["tiny_recipe"]["gain"] > 3 * record["tiny_recipe"]["gain_se"]
    assert set(published_peaks(record["device"]["name"])) <= {p for _, *peaks in GPU_PEAKS for p in peaks}


def test_summary_lines_name_each_stage():
    lines = gpu_proof.summary_lines(read_data("gpu_proof.json"))
    text = "\n".join(lines)
    for stage in [*gpu_proof.STAGES.values(), "checkpoint_save"]:
        assert stage in text
    assert "tiny recipe" in text


def test_published_peaks_pick_the_first_matching_gpu():
    assert published_peaks("NVIDIA H100 80GB HBM3") == (66.9e12, 3.35e12)  # SXM5
    assert published_peaks("NVIDIA H100 PCIe") == (51.2e12, 2.0e12)  # not the SXM5's
    assert published_peaks("Tesla T4") == (T4_FP32_FLOPS, T4_BANDWIDTH)
    with pytest.raises(ValueError, match="no published peaks"):
        published_peaks("Radeon")


def test_t4_step_estimate_scales_each_phase_by_the_ratio_of_the_two_rooflines():
    record = read_data("gpu_proof.json")
    stages = {k: v["seconds"] for k, v in record["qwen_step"]["modes"]["full"]["step"]["stages"].items()}
    got = t4_step_estimate(record)
    gen, train = got["phases"]["generation"], got["phases"]["training"]
    assert gen["measured"] == stages["generation"]
    assert train["measured"] == pytest.approx(stages["scoring_forward"] + stages["backward"])
    for phase in (gen, train):
        assert phase["share_of_bound"] == pytest.approx(phase["bound_here"] / phase["measured"])
        assert phase["t4_scaled"] == pytest.approx(phase["measured"] * phase["t4_bound"] / phase["bound_here"])
        assert phase["t4_low"] == max(phase["measured"], phase["t4_bound"])
        assert phase["t4_bound"] > phase["bound_here"]  # a T4 is slower than the GPU that measured
    assert got["step_low"] <= got["step_scaled"]
    # measured on a T4 itself, nothing is scaled
    as_if_t4 = copy.deepcopy(record)
    as_if_t4["device"]["name"] = "Tesla T4"
    same = t4_step_estimate(as_if_t4)["phases"]["generation"]
    assert same["t4_scaled"] == pytest.approx(same["measured"]) and same["t4_bound"] == same["bound_here"]
    as_if_t4["qwen_step"]["modes"]["full"]["status"] = "out of memory"
    with pytest.raises(ValueError, match="not measured"):
        t4_step_estimate(as_if_t4)
