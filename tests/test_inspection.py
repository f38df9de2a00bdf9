"""inspection: per-token tables and heatmaps; chapter 7's hand-assembled step equals the trainer's."""

import copy

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from grpo_tutorial import (  # noqa: E402
    GRPOConfig,
    GRPOTrainer,
    completion_logprobs,
    compute_rewards,
    correctness_reward,
    generate_rollouts,
    group_advantages,
    grpo_loss,
)
from grpo_tutorial.chapters.inspection import format_token_matrix, plot_token_heatmaps, token_strings  # noqa: E402
from grpo_tutorial.chapters.reward_design import number_format_reward  # noqa: E402
from grpo_tutorial.tasks import make_arithmetic_dataset  # noqa: E402
from grpo_tutorial.seeding import derive_seed  # noqa: E402


# --------------------------------------------------------------------- token_strings


def test_token_strings_names_special_tokens_and_spaces(small_policy):
    _, tok = small_policy
    ids = torch.tensor([tok(["7 ", "<eos>"], add_special_tokens=False)["input_ids"][0] + [tok.eos_token_id, tok.pad_token_id]])
    assert token_strings(tok, ids) == [["7", "␣", "<eos>", "<pad>"]]


def test_token_strings_rejects_float_ids(small_policy):
    _, tok = small_policy
    with pytest.raises(TypeError, match="ids must be an integer tensor"):
        token_strings(tok, torch.zeros(1, 2))


# --------------------------------------------------------------- format_token_matrix


def test_format_token_matrix_exact_text():
    values = torch.tensor([[1.0, -2.5, 9.0], [0.25, 0.0, 3.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    text = format_token_matrix(values, mask, row_labels=["7", "12"], tokens=[["7", "<eos>", "<pad>"], ["1", "2", "<eos>"]],
                               fmt="{:+.2f}", title="logp")
    assert text.splitlines() == [
        "logp",
        "row        t0       t1           t2",
        "  0  '7'   7 +1.00  <eos> -2.50  ·",
        "  1  '12'  1 +0.25  ·            ·",
    ]


def test_format_token_matrix_without_mask_or_labels():
    text = format_token_matrix(torch.tensor([[1, 2]]), fmt="{:.0f}")
    assert text.splitlines() == ["row  t0  t1", "  0  1   2"]


def test_format_token_matrix_checks_shapes():
    with pytest.raises(ValueError, match="mask has shape"):
        format_token_matrix(torch.zeros(2, 3), torch.ones(2, 2))
    with pytest.raises(ValueError, match="row_labels has 1 entries but values has 2 rows"):
        format_token_matrix(torch.zeros(2, 3), row_labels=["a"])
    with pytest.raises(ValueError, match="tokens must be 2 rows of 3"):
        format_token_matrix(torch.zeros(2, 3), tokens=[["a"] * 3])
    with pytest.raises(ValueError, match="values must have 2 dimensions"):
        format_token_matrix(torch.zeros(3))


# --------------------------------------------------------------- plot_token_heatmaps


def test_plot_token_heatmaps_blanks_padding_and_centres_diverging_panels():
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [0, 0]])
    logp = torch.tensor([[-1.0, -2.0], [-0.5, 99.0], [-3.0, -0.1], [5.0, 5.0]])
    push = torch.tensor([[0.5, 0.5], [-1.0, 7.0], [0.25, 0.25], [3.0, 3.0]])
    fig = plot_token_heatmaps({"logp": logp, "push": push}, mask, group_size=2, diverging=["push"],
                              tokens=[["a", "b"]] * 4, row_labels=["r0", "r1", "r2", "r3"])
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 2
    shown = np.ma.filled(np.ma.masked_invalid(images[0].get_array()), np.nan)
    assert np.isnan(shown[1, 1]) and np.isnan(shown[3]).all()
    assert shown[0, 0] == -1.0
    low, high = images[1].get_clim()
    assert (low, high) == (-1.0, 1.0)  # symmetric about 0, from real cells only (7.0 is padding)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "a\n-1.00" in texts and len(texts) == 5  # one per real cell
    plt.close(fig)


def test_plot_token_heatmaps_errors():
    mask = torch.ones(4, 2)
    with pytest.raises(ValueError, match="panels must be a non-empty dict"):
        plot_token_heatmaps({}, mask)
    with pytest.raises(ValueError, match="not a panel"):
        plot_token_heatmaps({"a": torch.zeros(4, 2)}, mask, diverging=["b"])
    with pytest.raises(ValueError, match="group_size must be a positive int dividing the 4 rows"):
        plot_token_heatmaps({"a": torch.zeros(4, 2)}, mask, group_size=3)
    with pytest.raises(ValueError, match="mask has shape"):
        plot_token_heatmaps({"a": torch.zeros(4, 3)}, mask)


# ------------------------------------------- chapter 7: the step by hand = the trainer


def hand_step(model, tok, batch, cfg, *, trainer_order: bool):
    """Chapter 7's assembly: stages 1-6 from the package, with a frozen reference copy."""
    G = cfg.group_size
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay, fused=True)
    rollout = generate_rollouts(model, tok, [r["prompt"] for r in batch], group_size=G,
                                max_new_tokens=cfg.max_new_tokens, generator_seed=derive_seed(cfg.seed, 0, 0))
    answers = [r["answer"] for r in batch for _ in range(G)]
    rewards, _ = compute_rewards([correctness_reward, number_format_reward], cfg.reward_weights,
                                 rollout.prompts, rollout.completions, answers)
    adv = group_advantages(rewards, G)
    Tc = rollout.completion_ids.shape[1]
    with torch.no_grad():
        model.eval()
        old = completion_logprobs(model, rollout.input_ids, rollout.attention_mask, Tc)
        ref_logp = completion_logprobs(ref, rollout.input_ids, rollout.attention_mask, Tc)
    model.train()
    rows = torch.arange(len(rollout))
    if trainer_order:
        rows = torch.randperm(len(rollout), generator=torch.Generator().manual_seed(derive_seed(cfg.seed, 2, 0)))
    logp = completion_logprobs(model, rollout.input_ids[rows], rollout.attention_mask[rows], Tc)
    # The separate no-grad pass gives the old log-probs up to rounding; with one update per step
    # the trainer takes them from this very pass (detached), the same bits on every machine (a
    # no-grad pass in eval mode and a training pass may pick different kernels: on an Intel Xeon
    # under ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 they differ in the last bits).
    torch.testing.assert_close(old[rows], logp.detach(), rtol=0, atol=1e-5)
    old = logp.detach() if trainer_order else old[rows]
    loss, _ = grpo_loss(logp, old, adv[rows], rollout.completion_mask[rows], ref_logp=ref_logp[rows],
                        beta=cfg.beta, clip_eps=cfg.clip_eps, max_completion_length=cfg.max_new_tokens)
    opt.zero_grad()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    opt.step()
    model.eval()
    return rollout, rewards, loss.item(), norm.item()


@pytest.mark.filterwarnings("ignore:step 1.*max_new_tokens")
@pytest.mark.parametrize("trainer_order, share", [(True, False), (False, False), (True, True)])
def test_hand_assembled_step_matches_train_step(trainer_order, share, make_small_policy):
    """Chapter 7 scores every row in full by hand (share_prompt_cache=False makes the trainer
    do the same, so the same order is bit for bit); the default shared-prompt pass agrees
    up to rounding."""
    batch = make_arithmetic_dataset(2, 3, digits=1)
    cfg = GRPOConfig(group_size=4, prompts_per_step=2, max_new_tokens=3, learning_rate=1e-3, beta=0.04,
                     reward_weights=[1.0, 0.3], seed=0, share_prompt_cache=share)
    hand_model, tok = make_small_policy()
    trainer_model, _ = make_small_policy()
    initial, _ = make_small_policy()
    rollout, rewards, loss, norm = hand_step(hand_model, tok, batch, cfg, trainer_order=trainer_order)
    assert rewards.std() > 0, "the rewards must vary, or the step is trivially zero"
    row = GRPOTrainer(trainer_model, tok, [correctness_reward, number_format_reward], cfg).train_step(batch)
    assert row["reward_mean"] == pytest.approx(rewards.mean().item(), abs=1e-6)
    assert row["grad_norm"] == pytest.approx(norm, rel=1e-5)
    assert row["loss"] == pytest.approx(loss, abs=1e-6)
    # The reference is the policy before the update: the KL is 0 in exact arithmetic, but the
    # reference's own scoring pass may round differently (8.3e-15 on an Intel Xeon, exactly 0
    # on an AMD EPYC); a real one-step KL is of order 1e-2, eleven orders above the bound.
    assert abs(row["kl"]) < 1e-9
    moved = any(not torch.equal(p, q) for p, q in zip(hand_model.parameters(), initial.parameters()))
    assert moved
    for p, q in zip(hand_model.parameters(), trainer_model.parameters()):
        if trainer_order and not share:  # the same row order and the same pass: bit for bit
            assert torch.equal(p, q)
        elif not share:  # rows summed in another order: the last float bits may differ
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
        else:  # prompts encoded once: other rounding in every gradient, and AdamW's first step is
            # lr * g / |g|, so a weight whose gradient is near 0 can move by a visible part of lr
            torch.testing.assert_close(p, q, rtol=1e-4, atol=0.05 * cfg.learning_rate)
