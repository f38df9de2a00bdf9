"""Tests for grpo_tutorial.models: the character tokenizer, the tiny policy, and the device/dtype choice.

Everything runs offline on the CPU. The loaders (``load_policy``, the SmolLM2 cache,
the hub) are tested in ``tests/test_pretrained.py``.
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

from grpo_tutorial.models import build_char_tokenizer, build_tiny_policy, generation_dtype, pick_device_and_dtype


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_policy()


def same_weights(model_a, model_b) -> bool:
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
    assert same_weights(model, again)
    other, _ = build_tiny_policy(seed=1)
    assert not same_weights(model, other)


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


def test_gpu_with_bf16_defaults_to_float32_and_generates_in_bf16(monkeypatch):
    _fake_cuda(monkeypatch, bf16=True)
    assert pick_device_and_dtype() == (torch.device("cuda"), torch.float32)  # weights that train (issue 33)
    assert generation_dtype() == torch.bfloat16
    assert pick_device_and_dtype("cpu") == (torch.device("cpu"), torch.float32)
    assert generation_dtype("cpu") == torch.float32


def test_gpu_without_bf16_defaults_to_float32_and_generates_in_fp16(monkeypatch):
    _fake_cuda(monkeypatch, bf16=False)  # Colab's T4
    assert pick_device_and_dtype() == (torch.device("cuda"), torch.float32)
    assert generation_dtype() == torch.float16
    assert pick_device_and_dtype("cuda:0", "fp16") == (torch.device("cuda:0"), torch.float16)


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
