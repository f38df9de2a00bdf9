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


def test_warm_start_until_stops_at_the_target_and_keeps_every_check(make_small_policy):
    """The warm start the command line, chapter 8's recipe and the sweeps of chapters 13 and 16 share (issue 56):
    the probe at every check_every steps, the first value at or above the target stops it, and the RNG is the
    config's seed's, so two runs are one."""
    from grpo_tutorial.sft import warm_start_until

    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(5) for b in range(5)]
    config = SFTConfig(steps=60, batch_size=8, warmup_steps=1, seed=3)
    values = iter([0.1, 0.4, 0.7, 0.9])
    model, tok = make_small_policy(seed=1)
    done = warm_start_until(model, tok, rows, config, lambda m: next(values), 0.5, check_every=10, progress=False)
    assert done["checks"] == [(10, 0.1), (20, 0.4), (30, 0.7)]  # 0.7 >= 0.5 stops it at step 30
    assert (done["steps"], done["reached"], len(done["history"])) == (30, True, 30)
    torch.manual_seed(123)  # whatever the random state before it, the run after it starts from the same one
    never = warm_start_until(make_small_policy(seed=1)[0], tok, rows, config, lambda m: 0.0, 0.5, check_every=25,
                             progress=False)
    after_never = torch.rand(4)
    assert never["checks"] == [(25, 0.0), (50, 0.0)] and (never["steps"], never["reached"]) == (60, False)
    torch.manual_seed(456)
    again = warm_start_until(make_small_policy(seed=1)[0], tok, rows, config, None, None, check_every=10,
                             progress=False)
    assert (again["checks"], again["steps"], again["reached"]) == ([], 60, False)  # no probe: every step
    assert [h["loss"] for h in again["history"]] == [h["loss"] for h in never["history"]]  # the seed's run, both
    assert torch.equal(torch.rand(4), after_never)
