"""The supervised warm start that gives the tiny model partial skill before GRPO."""

import pytest
import torch

from grpo_tutorial.sft import SFTConfig, encode_sft_batch, supervised_warmup


def test_labels_cover_only_answer_and_eos(small_policy):
    _, tok = small_policy
    batch = encode_sft_batch(tok, [{"prompt": "1+2=", "answer": "3"}, {"prompt": "10+20=", "answer": "30"}])
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    assert ids.shape == labels.shape == mask.shape == (2, 10)  # <bos> 1 0 + 2 0 = 3 0 <eos>
    assert tok.decode(ids[0][mask[0].bool()]) == "<bos>1+2=3<eos>"
    kept = labels[1][labels[1] != -100]
    assert tok.convert_ids_to_tokens(kept.tolist()) == ["3", "0", "<eos>"]
    assert (labels[0][mask[0] == 0] == -100).all()  # padding is never a target


def test_missing_keys_are_reported(small_policy):
    _, tok = small_policy
    with pytest.raises(ValueError, match="row 1 needs 'prompt' and 'answer'"):
        encode_sft_batch(tok, [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2="}])


def test_warmup_lowers_the_loss_and_stops_on_request(make_small_policy):
    model, tok = make_small_policy(seed=1)
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(5) for b in range(5)]
    history = supervised_warmup(
        model, tok, rows, SFTConfig(steps=60, batch_size=16, learning_rate=3e-3, warmup_steps=5), progress=False
    )
    assert len(history) == 60
    first = sum(h["loss"] for h in history[:5]) / 5
    last = sum(h["loss"] for h in history[-5:]) / 5
    assert last < 0.7 * first
    calls = []
    history = supervised_warmup(
        model, tok, rows, SFTConfig(steps=60, batch_size=8, warmup_steps=1),
        stop_when=lambda m: calls.append(1) or len(calls) == 2, check_every=10, progress=False,
    )
    assert len(history) == 20 and history[-1]["stopped"] is True


def test_config_validation():
    with pytest.raises(ValueError, match="SFTConfig.steps"):
        SFTConfig(steps=0)
    with pytest.raises(ValueError, match="learning_rate"):
        SFTConfig(learning_rate=0.0)
