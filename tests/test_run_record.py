"""Chapter 9's run record: its schema, the shared records in grpo_tutorial/data/community/, and how they print.

``tests/test_smollm2_gpu_path.py`` writes a record from a real run on the CPU and
reads it back; here the schema is tested on records built by hand, and every
shared record that ships with the package is checked against it.
"""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path

import pytest

from grpo_tutorial.chapters.gsm8k import GSM8K_PRESET, compare_scores, score_evaluation
from grpo_tutorial.chapters.run_record import (
    COMMUNITY_FOLDER,
    RECORD_KIND,
    SCHEMA,
    build_run_record,
    community_records,
    read_run_record,
    record_lines,
    validate_run_record,
    write_run_record,
)
from grpo_tutorial.presets import get_preset

COMMUNITY = Path(str(resources.files("grpo_tutorial.data").joinpath(COMMUNITY_FOLDER)))


def _result():
    answers = ["1", "2", "3", "4"]
    before = {"records": [{"completion": c, "answer": a, "truncated": False}
                          for c, a in zip(["1", "\\boxed{2}", "5", "4"], answers)]}
    after = {"records": [{"completion": f"\\boxed{{{a}}}", "answer": a, "truncated": False} for a in answers]}
    fast = {"sampler/decode_ms": 20.0, "sampler/compile_seconds": 0.0}  # a fast sampler's fields (issue 43)
    return {"config": get_preset(GSM8K_PRESET), "history": [
        {"step": 1, "step_seconds": 2.0, **fast, "sampler/decode_ms": 90.0, "sampler/compile_seconds": 40.0},
        {"step": 2, "step_seconds": 4.0, **fast, "sampler/decode_ms": 14.0}, {"step": 3, "step_seconds": 3.0, **fast}],
            "scores": compare_scores(score_evaluation(before), score_evaluation(after)), "resumed_from": 2}


#: What chapter 9 showed before the run (chapter9_estimate's "shown").
SHOWN = {"minutes": [27.4, 55.4], "sampler": "lora", "gpu_record": "335aac1c6b4ca59fdde01aee1a74c209315deb95",
         "steps": 20, "n_eval": 500}


@pytest.fixture
def record():
    return build_run_record(_result(), model="Qwen/Qwen2.5-0.5B-Instruct", data="gsm8k",
                            parts_seconds={"training": 90.0, "evaluation before": 30.0}, estimate=SHOWN)


def test_a_built_record_holds_every_field_of_the_schema(record):
    def keys(schema, prefix=""):
        for key, sub in schema.items():
            yield prefix + key
            if isinstance(sub, dict):
                yield from keys(sub, prefix + key + ".")

    def has(rec, path):
        for part in path.split("."):
            rec = rec[part]
        return True

    assert all(has(record, path) for path in keys(SCHEMA))
    assert record["kind"] == RECORD_KIND and record["steps"] == 3 and record["resumed_from"] == 2
    assert record["seconds"]["per_step_mean"] == 3.0 and record["seconds"]["per_step_median"] == 3.0
    assert record["evaluation"]["strict"]["before"] == 0.25 and record["evaluation"]["strict"]["after"] == 1.0
    assert record["settings"]["use_peft"] is True and record["settings"]["reward_weights"] == [1.0, 0.1]
    json.dumps(record, allow_nan=False)  # plain JSON, no NaN
    with pytest.raises(ValueError, match="has no evaluation"):
        build_run_record({**_result(), "scores": None}, model="m", data="d", parts_seconds={})


@pytest.mark.parametrize("change, message", [
    (lambda r: r.pop("device"), "device is missing"),
    (lambda r: r["evaluation"]["strict"].pop("gain_se"), "evaluation.strict.gain_se is missing"),
    (lambda r: r.update(steps="40"), "steps is str, expected int"),
    (lambda r: r.update(steps=True), "steps is a bool"),
    (lambda r: r["evaluation"]["lenient"].update(after=1.5), "evaluation.lenient.after is 1.5, expected a share"),
    (lambda r: r["evaluation"]["strict"].update(before_se=-0.1), "before_se is -0.1, a standard error is >= 0"),
    (lambda r: r.update(kind="something else"), "kind is 'something else'"),
    (lambda r: r.update(schema_version=99), "schema_version is 99"),
    (lambda r: r.update(created="yesterday"), "created is 'yesterday', not an ISO date"),
    (lambda r: r["seconds"]["parts"].update(training=-1), "seconds.parts.training is -1"),
    (lambda r: r.update(steps=0), "steps is 0, expected at least 1"),
    (lambda r: r.pop("sampler"), "sampler is missing"),
    (lambda r: r.pop("estimate"), "estimate is missing"),
    (lambda r: r["sampler"].update(decode_ms_median=-1.0), "sampler.decode_ms_median is -1.0, expected a number >= 0"),
    (lambda r: r["sampler"].update(fallbacks=1.5), "sampler.fallbacks is float, expected int or NoneType"),
    (lambda r: r["estimate"].update(minutes=[55.4, 27.4]), r"estimate.minutes is \[55.4, 27.4\], expected \[low, high\]"),
    (lambda r: r["estimate"].update(minutes="27-55"), "estimate.minutes is str, expected list or NoneType"),
    (lambda r: r["estimate"].update(steps=0), "estimate.steps is 0, expected at least 1"),
])
def test_a_broken_record_is_refused_by_the_path_of_what_is_wrong(record, change, message):
    broken = copy.deepcopy(record)
    change(broken)
    with pytest.raises(ValueError, match="is not a chapter 9 run record: .*" + message.replace("(", r"\(")):
        validate_run_record(broken)


def test_the_record_keeps_the_sampler_and_the_estimate_shown_and_an_older_record_still_reads(record):
    assert record["schema_version"] == 2
    # on this CPU the LoRA preset samples unmerged with the dynamic cache; its timings are the history's
    assert record["sampler"] == {"name": "lora", "decode_ms_median": 20.0, "compile_seconds": 40.0, "fallbacks": None}
    assert record["estimate"] == SHOWN
    no_estimate = build_run_record(_result(), model="m", data="d", parts_seconds={})
    assert no_estimate["estimate"] is None  # a run that showed none
    older = {k: v for k, v in record.items() if k not in ("sampler", "estimate")}
    assert validate_run_record({**older, "schema_version": 1})  # schema 1: no sampler, no estimate


def test_written_and_read_back_from_a_run_folder(record, tmp_path):
    path = write_run_record(tmp_path, record)
    assert path.name == "run_record.json" and read_run_record(tmp_path) == record == read_run_record(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="is not JSON"):
        read_run_record(path)
    with pytest.raises(FileNotFoundError, match="no run record"):
        read_run_record(tmp_path / "elsewhere")
    bad = copy.deepcopy(record)
    del bad["model"]
    with pytest.raises(ValueError, match="model is missing"):
        write_run_record(tmp_path / "bad.json", bad)
    assert not (tmp_path / "bad.json").exists()  # nothing written when the record is refused


def test_records_print_with_who_ran_them_on_what_and_when(record):
    record = {**record, "contributor": "a reader", "device": {**record["device"], "name": "Tesla T4",
                                                              "driver": "535.104.05"}}
    lines = record_lines(record, label="2026-12-01-t4-qwen.json")
    assert lines[0].startswith("2026-12-01-t4-qwen.json: by a reader, Tesla T4, driver 535.104.05, "
                               f"{record['created'][:10]}")
    assert "LoRA r=32" in lines[1] and "training 90 s, evaluation before 30 s" in lines[1]
    assert "training 2.5 min" in record_lines({**record, "seconds": {**record["seconds"], "parts": {"training": 150}}})[1]
    assert lines[2].startswith("  strict   0.250 -> 1.000, gain +0.750 ±") and "n = 4" in lines[2]
    assert lines[-2] == "  sampler lora: 20.0 ms a decoding step (median), compile 40 s"
    assert lines[-1] == ("  estimate shown before the run: 27 to 55 min (sampler lora, GPU record 335aac1c6b); the "
                         "parts measured: 2 min, below it")
    long = {**record, "seconds": {**record["seconds"], "parts": {"training": 3600.0}}}
    assert record_lines(long)[-1].endswith("the parts measured: 60 min, ABOVE it")


def test_the_shared_records_folder_ships_with_the_package_and_holds_only_valid_records():
    assert COMMUNITY.is_dir() and (COMMUNITY / "README.md").is_file()
    files = sorted(p.name for p in COMMUNITY.glob("*.json"))
    found = community_records()
    assert sorted(name for name, _ in found) == files  # every JSON file is read, and each one validated
    for _, rec in found:
        assert rec["device"]["kind"] == "cuda", "a shared record comes from a GPU session"
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert '"community/*.json"' in pyproject  # pip install brings them along


def test_a_bad_shared_record_is_named(tmp_path, record):
    (tmp_path / "good.json").write_text(json.dumps(record))
    broken = copy.deepcopy(record)
    broken["evaluation"]["n"] = 0
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    with pytest.raises(ValueError, match="community record 'broken.json' is not a chapter 9 run record: "
                                         "evaluation.n is 0"):
        community_records(tmp_path)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="'broken.json' is not JSON"):
        community_records(tmp_path)
    assert community_records(tmp_path / "missing") == []


def test_package_commit_is_the_checkout_the_package_lies_in(tmp_path, monkeypatch):
    """One ``package_commit`` for every record (issue 56): the checkout's HEAD and whether the code differs from it;
    a package inside some other checkout (a virtual environment within a repository) is not that HEAD."""
    import subprocess
    from importlib import metadata

    from grpo_tutorial.chapters import run_record

    direct = metadata.distribution("grpo-tutorial").read_text("direct_url.json") or "{}"
    if json.loads(direct).get("vcs_info"):
        pytest.skip("installed from git: pip's record names the commit")
    root = Path(run_record.__file__).resolve().parents[2]
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    got = run_record.package_commit()
    if head.returncode != 0:
        assert got == {"package_commit": None, "package_dirty": None}
        return
    assert got["package_commit"] == head.stdout.strip() and isinstance(got["package_dirty"], bool)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "other"], check=True)
    inside = tmp_path / "venv" / "site-packages" / "grpo_tutorial" / "chapters" / "run_record.py"
    inside.parent.mkdir(parents=True)
    inside.write_text("")
    monkeypatch.setattr(run_record, "__file__", str(inside))
    assert run_record.package_commit() == {"package_commit": None, "package_dirty": None}


def test_json_safe_writes_strict_json():
    import math

    import numpy as np

    from grpo_tutorial.chapters.run_record import json_safe

    got = json_safe({"a": (1.5, math.nan, -math.inf), 2: {"n": np.int64(3), "x": np.float32(0.5), "ok": True},
                     "f": print})
    assert got == {"a": [1.5, None, None], "2": {"n": 3, "x": 0.5, "ok": True}, "f": repr(print)}
    assert type(got["2"]["n"]) is int and type(got["2"]["x"]) is float
    json.dumps(got, allow_nan=False)  # strict JSON
