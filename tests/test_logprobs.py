"""Stage 4: token log-probs, completion masks, and log-probs from a real (tiny) model."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import Qwen2Config, Qwen2ForCausalLM

from grpo_tutorial import completion_logprobs, completion_mask, token_entropy, token_logprobs

PAD, EOS = 0, 1


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(2, 50), st.integers(0, 10_000))
def test_token_logprobs_matches_log_softmax_gather(N, T, V, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(N, T, V, generator=g) * 5
    tokens = torch.randint(0, V, (N, T), generator=g)
    expected = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    torch.testing.assert_close(token_logprobs(logits, tokens), expected)


def test_token_logprobs_gradient_matches_log_softmax():
    logits = torch.randn(2, 3, 11, requires_grad=True)
    tokens = torch.randint(0, 11, (2, 3))
    weights = torch.randn(2, 3)
    (token_logprobs(logits, tokens) * weights).sum().backward()
    ours = logits.grad.clone()
    logits.grad = None
    (torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1) * weights).sum().backward()
    torch.testing.assert_close(ours, logits.grad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_are_scored_in_float32(dtype):
    logits = torch.randn(3, 4, 1000) * 4
    tokens = torch.randint(0, 1000, (3, 4))
    out = token_logprobs(logits.to(dtype), tokens)
    assert out.dtype == torch.float32
    expected = torch.log_softmax(logits.to(dtype).float(), -1).gather(-1, tokens[..., None]).squeeze(-1)
    torch.testing.assert_close(out, expected)


def test_token_logprobs_bad_input():
    with pytest.raises(ValueError, match="tokens has shape"):
        token_logprobs(torch.randn(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="integer"):
        token_logprobs(torch.randn(2, 3, 5), torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        token_logprobs(torch.randn(2, 3, 5), torch.full((2, 3), 5))
    with pytest.raises(ValueError, match="3 dimensions"):
        token_logprobs(torch.randn(2, 5), torch.zeros(2, dtype=torch.long))


def test_completion_mask_cases():
    ids = torch.tensor(
        [
            [5, 6, 7, 8],  # no EOS: truncated, all tokens count
            [EOS, PAD, PAD, PAD],  # EOS at position 0: only the EOS counts
            [5, EOS, PAD, PAD],  # padding after EOS is masked
            [5, EOS, 7, EOS],  # only the first EOS ends it
            [EOS, EOS, EOS, EOS],  # pad == eos tokenizers
        ]
    )
    expected = torch.tensor(
        [[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float32
    )
    assert torch.equal(completion_mask(ids, EOS), expected)


def test_completion_mask_accepts_several_eos_ids():
    ids = torch.tensor([[5, 9, 1, 1], [5, 5, 1, 9]])
    assert completion_mask(ids, [1, 9]).tolist() == [[1, 1, 0, 0], [1, 1, 1, 0]]


def test_completion_mask_bad_input():
    with pytest.raises(ValueError, match="eos_token_id is None"):
        completion_mask(torch.zeros(1, 2, dtype=torch.long), None)
    with pytest.raises(TypeError, match="integer"):
        completion_mask(torch.zeros(1, 2), 1)


def test_token_entropy_matches_definition():
    logits = torch.randn(2, 3, 7)
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(token_entropy(logits), -(p * p.log()).sum(-1))


# -- with a model ---------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=2,
    )
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config.pad_token_id = PAD
    model.generation_config.eos_token_id = EOS
    return model


def _left_pad(rows, width):
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return ids, mask


def test_left_padding_does_not_change_log_probs(tiny_model):
    """A row scores the same alone as in a batch where it is left-padded."""
    short, long = [2, 5, 6, 7, 8, 9], [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    ids, mask = _left_pad([short, long], 10)
    batched = completion_logprobs(tiny_model, ids, mask, completion_length=3)
    alone = completion_logprobs(tiny_model, torch.tensor([short]), torch.ones(1, 6, dtype=torch.long), 3)
    torch.testing.assert_close(batched[0], alone[0])


def test_log_probs_equal_the_distribution_generate_sampled_from(tiny_model):
    """The forward-pass log-probs must equal the sampler's, or the first ratio is not 1."""
    ids, mask = _left_pad([[2, 5, 6], [2, 3, 4, 5, 6, 7]], 6)
    torch.manual_seed(1)
    out = tiny_model.generate(
        input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.7, top_k=0, max_new_tokens=5,
        output_logits=True, return_dict_in_generate=True, min_new_tokens=5,
    )
    completion = out.sequences[:, ids.shape[1]:]  # [N, 5]
    sampler_logits = torch.stack(out.logits, dim=1) / 0.7  # [N, 5, V]
    expected = token_logprobs(sampler_logits, completion)
    full_mask = torch.cat([mask, torch.ones_like(completion)], dim=1)
    ours = completion_logprobs(tiny_model, out.sequences, full_mask, 5, temperature=0.7)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_completion_logprobs_entropy_and_gradient(tiny_model):
    ids = torch.tensor([[2, 5, 6, 7, 8]])
    logp, entropy = completion_logprobs(tiny_model, ids, torch.ones_like(ids), 2, return_entropy=True)
    assert logp.shape == entropy.shape == (1, 2)
    assert logp.requires_grad and not entropy.requires_grad
    assert (entropy > 0).all() and (logp < 0).all()


def test_completion_logprobs_bad_input(tiny_model):
    ids = torch.tensor([[2, 5, 6]])
    with pytest.raises(ValueError, match="completion_length"):
        completion_logprobs(tiny_model, ids, torch.ones_like(ids), 3)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        completion_logprobs(tiny_model, ids, torch.ones(1, 2), 1)
    with pytest.raises(ValueError, match="temperature"):
        completion_logprobs(tiny_model, ids, torch.ones_like(ids), 1, temperature=0.0)


def test_half_precision_path_keeps_no_full_float32_copy_for_backward():
    """What autograd saves for a bf16 batch stays below one float32 copy of all logits."""
    logits = (torch.randn(4, 8, 1000) * 3).to(torch.bfloat16).requires_grad_()
    tokens = torch.randint(0, 1000, (4, 8))
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = token_logprobs(logits, tokens)
    float32_bytes = sum(t.numel() * t.element_size() for t in saved if t.dtype == torch.float32)
    assert float32_bytes <= 4 * 8 * 1000 * 4 * 1.01  # at most one float32 copy in total
    out.sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad.float()).all()


# ---------------------------------------------------------------------------
# The block-wise scorer (issue 21, item 6): same numbers, less memory
# ---------------------------------------------------------------------------

from grpo_tutorial import speedups as speedups_module  # noqa: E402
from grpo_tutorial.speedups import score_tokens  # noqa: E402


def _scored_before(logits, tokens, temperature):
    """The package's scoring before issue 21: the whole tensor at once (its backward by autograd)."""
    z = logits / temperature if temperature != 1.0 else logits
    logp = torch.gather(z, -1, tokens.long().unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)
    if z.dtype == torch.float32:
        return logp, token_entropy(z)
    log_z = torch.logsumexp(z, dim=-1, keepdim=True)  # token_entropy's formula, in float64
    return logp, log_z.squeeze(-1) - (torch.exp(z - log_z) * z).sum(dim=-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("budget", [2**22, 2 * 37, 37])  # one block; blocks of rows; pieces of one row
def test_block_scorer_gives_the_same_bits_as_the_whole_tensor(temperature, budget, monkeypatch):
    """Values and the log-prob gradient are bit-identical to the plain formula, however the logits are cut."""
    monkeypatch.setattr(speedups_module, "CHUNK_ELEMENTS", budget)
    g = torch.Generator().manual_seed(0)
    base = torch.randn(3, 5, 37, generator=g) * 4
    tokens = torch.randint(0, 37, (3, 5), generator=g)
    weights = torch.randn(3, 5, generator=g)
    a, b = base.clone().requires_grad_(), base.clone().requires_grad_()
    logp, ent = score_tokens(a, tokens, temperature=temperature, entropy=True)
    ref_logp, ref_ent = _scored_before(b, tokens, temperature)
    assert torch.equal(logp, ref_logp) and torch.equal(ent, ref_ent)
    assert not ent.requires_grad  # the entropy is a statistic unless entropy_grad=True
    (logp * weights).sum().backward()
    (ref_logp * weights).sum().backward()
    assert torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("budget", [2**22, 11])
def test_entropy_gradient_is_the_exact_formula(budget, monkeypatch):
    """d logp/dz and d H/dz written out by hand: exact in float64 (gradcheck, and equal to autograd through
    the plain formula), and within float32 rounding of it in float32."""
    monkeypatch.setattr(speedups_module, "CHUNK_ELEMENTS", budget)
    g = torch.Generator().manual_seed(1)
    base = torch.randn(2, 4, 11, generator=g, dtype=torch.float64) * 3
    tokens = torch.randint(0, 11, (2, 4), generator=g)
    w_lp, w_h = torch.randn(2, 4, generator=g, dtype=torch.float64), torch.randn(2, 4, generator=g, dtype=torch.float64)

    def grad(fn, x):
        x = x.clone().requires_grad_()
        logp, ent = fn(x)
        ((logp * w_lp.to(x.dtype)).sum() + (ent * w_h.to(x.dtype)).sum()).backward()
        return x.grad

    def ours(x):
        return score_tokens(x, tokens, temperature=0.9, entropy=True, entropy_grad=True)

    def plain(x):
        return _scored_before(x, tokens, 0.9)

    torch.autograd.gradcheck(ours, (base.clone().requires_grad_(),))
    truth = grad(plain, base)  # float64
    torch.testing.assert_close(grad(ours, base), truth, rtol=1e-12, atol=1e-12)
    # float32: rounding of z (|z| up to ~12) times weights of order 1 gives errors of a few 1e-6
    torch.testing.assert_close(grad(ours, base.float()).double(), truth, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_gradient_is_the_float32_gradient_rounded_once(dtype):
    logits = (torch.randn(2, 3, 50) * 3).to(dtype)
    tokens = torch.randint(0, 50, (2, 3))
    a = logits.clone().requires_grad_()
    b = logits.float().requires_grad_()
    assert score_tokens(a, tokens).dtype == torch.float32
    score_tokens(a, tokens).sum().backward()
    score_tokens(b, tokens).sum().backward()
    assert a.grad.dtype == dtype
    assert torch.equal(a.grad, b.grad.to(dtype))


def test_positions_past_the_tokens_get_no_gradient():
    """completion_logprobs hands over the model's [N, Tc+1, V] logits unsliced; the last position scores nothing."""
    logits = torch.randn(2, 4, 9, requires_grad=True)
    tokens = torch.randint(0, 9, (2, 3))
    logp = score_tokens(logits, tokens)
    logp.sum().backward()
    assert torch.equal(logits.grad[:, 3], torch.zeros(2, 9))
    assert torch.equal(logp, token_logprobs(logits[:, :3], tokens))
    with pytest.raises(ValueError, match="expected tokens \\[N, t\\] and logits \\[N, L, V\\] with L >= t"):
        score_tokens(logits, torch.zeros(2, 5, dtype=torch.long))


def test_scoring_and_backward_peak_memory_is_lower():
    """benchmarks/logprob_memory.py at small shapes: the block scorer's peak is at most about two logits tensors
    (the logits and their gradient), the whole-tensor scorer's above three and a half."""
    pytest.importorskip("benchmarks.logprob_memory")
    from pathlib import Path

    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak resident size")
    from benchmarks.logprob_memory import QUICK, compare

    result = compare(dict(QUICK), layers=1, threads=1)
    unit = result["before"]["logits_bytes"]
    before = result["before"]["peak_bytes_above_start"] / unit
    after = result["after"]["peak_bytes_above_start"] / unit
    assert before > 3.5, before
    assert after < 2.5, after
    assert result["after"]["loss"] == pytest.approx(result["before"]["loss"], abs=1e-6)
    assert result["after"]["logp_sum"] == pytest.approx(result["before"]["logp_sum"], rel=1e-6)
    assert result["after"]["entropy_mean"] == pytest.approx(result["before"]["entropy_mean"], rel=1e-6)
