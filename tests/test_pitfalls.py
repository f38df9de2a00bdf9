"""Chapter 10's helpers: token weights per loss type, the bug gallery, right padding."""

import copy
import logging
import math
import warnings

import pytest
import torch

from grpo_tutorial import completion_logprobs, generate_rollouts, grpo_loss
from grpo_tutorial.chapters.pitfalls import (
    BUGS,
    GALLERY_IGNORES,
    GALLERY_IMPLEMENTS,
    GALLERY_REFUSES,
    captured_logs,
    gallery_step,
    generate_right_padded,
    sequence_level_inputs,
    token_weights,
    train_with_bug,
)
from grpo_tutorial.optim import make_optimizer as make_optimizer_and_schedule
from grpo_tutorial.optim import trainable_parameters
from grpo_tutorial.sft import SFTConfig, supervised_warmup
from grpo_tutorial.tasks import make_arithmetic_dataset
from grpo_tutorial.trainer import TIMING_KEYS, GRPOConfig, GRPOTrainer, GRPOWarning

from helpers import length_reward, small_config

EXTRA_KEYS = {"ratio_first_mean", "ratio_first_max", "clip_frac_first", "grad_after_eos", "loss_has_grad_fn"}


@pytest.fixture(scope="module")
def warm(make_small_policy):
    """A tiny model with a few supervised steps: its completions end with EOS at different lengths.
    Its weights, tokenizer, rows, and the builder of the fresh models that take the weights."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    model, tokenizer = make_small_policy()
    rows = make_arithmetic_dataset(200, 0, digits=1)
    supervised_warmup(model, tokenizer, rows, SFTConfig(steps=40, batch_size=32, learning_rate=3e-3, warmup_steps=10), progress=False)
    torch.set_num_threads(before)
    return model.state_dict(), tokenizer, rows, make_small_policy


def fresh(warm):
    state, tokenizer, rows, make_small_policy = warm
    model, _ = make_small_policy()
    model.load_state_dict(state)
    return model, tokenizer, rows


def config(**kwargs):
    """The gallery's settings: 4 prompts x 4 completions of at most 4 tokens, two passes over each batch."""
    return small_config(**{"prompts_per_step": 4, "max_new_tokens": 4, "num_iterations": 2, "learning_rate": 1e-2,
                           **kwargs})


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def make_optimizer(model, cfg):
    """The package's optimizer and schedule, as the trainer builds them."""
    return make_optimizer_and_schedule(trainable_parameters(model), cfg)


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


# ---------------------------------------------------------------- token weights


def test_token_weights_match_the_three_normalisers():
    lengths = [1, 2, 4]
    torch.testing.assert_close(token_weights(lengths, "grpo"), torch.tensor([1 / 3, 1 / 6, 1 / 12], dtype=torch.float64))
    for kind in ("dapo", "bnpo"):
        torch.testing.assert_close(token_weights(lengths, kind), torch.full((3,), 1 / 7, dtype=torch.float64))
    torch.testing.assert_close(
        token_weights(lengths, "dr_grpo", max_completion_length=8), torch.full((3,), 1 / 24, dtype=torch.float64)
    )
    # default constant: the longest length
    torch.testing.assert_close(token_weights(lengths, "dr_grpo"), torch.full((3,), 1 / 12, dtype=torch.float64))


def test_dapo_weight_depends_on_the_rest_of_the_batch_grpo_does_not():
    short_batch, long_batch = [8, 2, 2, 2], [8, 16, 16, 16]
    assert token_weights(short_batch, "dapo")[0] == pytest.approx(1 / 14)
    assert token_weights(long_batch, "dapo")[0] == pytest.approx(1 / 56)
    assert token_weights(short_batch, "grpo")[0] == token_weights(long_batch, "grpo")[0] == pytest.approx(1 / 32)


@pytest.mark.parametrize(
    "lengths, kwargs, error",
    [
        ([], {}, ValueError),
        ([0, 2], {}, ValueError),
        ([1.5, 2.0], {}, ValueError),
        ([[1, 2]], {}, ValueError),
        ([1, 4], {"max_completion_length": 3}, ValueError),
        ([1, 4], {"max_completion_length": 4.0}, ValueError),
    ],
)
def test_token_weights_rejects_bad_input(lengths, kwargs, error):
    with pytest.raises(error):
        token_weights(lengths, "dr_grpo", **kwargs)


def test_token_weights_rejects_unknown_loss_type():
    with pytest.raises(ValueError, match="loss_type"):
        token_weights([1, 2], "mean")


# ------------------------------------------------------- sequence-level inputs


def test_sequence_level_ratio_is_the_product_of_token_ratios():
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, float("-inf")]])  # [2, 3]
    log_ratio = torch.tensor([[0.1, 0.2, -0.05], [0.3, 0.1, 5.0]])  # [2, 3]
    new = old + log_ratio
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # row 1 has padding (and -inf) at the end
    seq_new, seq_old, ones = sequence_level_inputs(new, old, mask)
    assert seq_new.shape == seq_old.shape == ones.shape == (2, 1)
    ratio = torch.exp(seq_new - seq_old)[:, 0]  # [2]
    torch.testing.assert_close(ratio, torch.tensor([math.exp(0.25), math.exp(0.4)]))
    torch.testing.assert_close(ones, torch.ones(2, 1))


def test_sequence_level_gradient_loses_the_per_token_mean():
    """At ratio 1, the summed version pushes each token len_i times harder (grpo loss)."""
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])  # lengths 4 and 2
    adv = torch.tensor([1.0, -1.0])
    old = torch.full((2, 4), -1.0)
    new = old.clone().requires_grad_()
    loss, _ = grpo_loss(new, old, adv, mask)
    (token_grad,) = torch.autograd.grad(loss, new)
    new2 = old.clone().requires_grad_()
    loss_seq, _ = grpo_loss(*sequence_level_inputs(new2, old, mask)[:2], adv, torch.ones(2, 1))
    (seq_grad,) = torch.autograd.grad(loss_seq, new2)
    torch.testing.assert_close(token_grad, torch.tensor([[-1 / 8] * 4, [1 / 4, 1 / 4, 0, 0]]))
    torch.testing.assert_close(seq_grad, torch.tensor([[-1 / 2] * 4, [1 / 2, 1 / 2, 0, 0]]))


def test_sequence_level_inputs_checks_shapes():
    with pytest.raises(ValueError, match="one shape"):
        sequence_level_inputs(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 4))
    with pytest.raises(TypeError, match="logp"):
        sequence_level_inputs([[0.0]], torch.zeros(1, 1), torch.ones(1, 1))


# ------------------------------------------------------------ the correct step


def test_correct_step_is_the_trainer_step(warm):
    cfg = config()
    m1, tokenizer, rows = fresh(warm)
    m2, _, _ = fresh(warm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GRPOWarning)
        expected = GRPOTrainer(m1, tokenizer, length_reward, cfg).train(rows, 3, progress=False)
    got = train_with_bug(m2, tokenizer, length_reward, rows, cfg, 3)
    assert len(got) == 3
    for a, b in zip(expected, got):
        assert set(b) - set(a) == EXTRA_KEYS
        for key in a:
            if key in TIMING_KEYS or key in ("lr", "skipped_updates", "groups_drawn"):
                continue
            assert a[key] == b[key] or (math.isnan(a[key]) and math.isnan(b[key])), key
        assert b["ratio_first_mean"] == pytest.approx(1.0, abs=1e-6)
        assert b["ratio_first_max"] == pytest.approx(1.0, abs=1e-6)
        assert b["clip_frac_first"] == 0.0
        assert b["grad_after_eos"] == 0.0
        assert b["loss_has_grad_fn"] == 1.0
    assert same(params(m1), params(m2))
    assert not same(params(m1), params(fresh(warm)[0]))


# ------------------------------------------------------------------- the bugs


def test_no_grad_bug_trains_nothing(warm):
    model, tokenizer, rows = fresh(warm)
    start = params(model)
    ref = copy.deepcopy(model)
    history = train_with_bug(model, tokenizer, length_reward, rows, config(), 3, bug="no_grad", ref_model=ref)
    assert same(params(model), start)
    for row in history:
        assert row["loss_has_grad_fn"] == 0.0
        assert row["grad_norm"] == 0.0
        assert row["ratio_max"] == pytest.approx(1.0, abs=1e-6)  # the policy never moves
        assert row["kl"] == pytest.approx(0.0, abs=1e-6)


def test_ref_as_old_ratio_leaves_one_once_the_policy_moves(warm):
    cfg = config(num_iterations=1, learning_rate=3e-2)
    model, tokenizer, rows = fresh(warm)
    good, _, _ = fresh(warm)
    bug = train_with_bug(model, tokenizer, length_reward, rows, cfg, 4, bug="ref_as_old", ref_model=copy.deepcopy(model))
    ok = train_with_bug(good, tokenizer, length_reward, rows, cfg, 4)
    # step 1: the reference still is the policy, so the bug is invisible
    assert bug[0]["ratio_first_max"] == pytest.approx(1.0, abs=1e-6)
    assert bug[0]["loss"] == pytest.approx(ok[0]["loss"], abs=1e-6)
    # later: the first pass already has ratios != 1 and clipped tokens; mu = 1 done right never clips
    assert all(r["clip_frac"] == 0.0 and r["ratio_first_max"] == pytest.approx(1.0, abs=1e-6) for r in ok)
    later = bug[1:]
    assert max(r["ratio_first_max"] for r in later) > 1.2
    assert max(r["clip_frac_first"] for r in later) > 0.0
    assert all(r["kl"] > 0 for r in later)


def test_ref_as_old_needs_a_reference(warm):
    model, tokenizer, rows = fresh(warm)
    with pytest.raises(ValueError, match="ref_model"):
        train_with_bug(model, tokenizer, length_reward, rows, config(), 1, bug="ref_as_old")


def test_sequence_ratio_is_invisible_at_mu_1_and_pushes_harder(warm):
    cfg = config(num_iterations=1)
    m1, tokenizer, rows = fresh(warm)
    m2, _, _ = fresh(warm)
    opt1, opt2 = make_optimizer(m1, cfg), make_optimizer(m2, cfg)
    ok = gallery_step(m1, tokenizer, length_reward, rows[:4], cfg, *opt1, step=0)
    bug = gallery_step(m2, tokenizer, length_reward, rows[:4], cfg, *opt2, step=0, bug="sequence_ratio")
    assert ok["ratio_max"] == bug["ratio_max"] == pytest.approx(1.0, abs=1e-6)
    assert ok["clip_frac"] == bug["clip_frac"] == 0.0
    # no mean over each completion's tokens: the gradient is longer by about the completion length
    assert bug["grad_norm"] > 1.5 * ok["grad_norm"]


def test_no_eos_mask_trains_on_padding_and_lies_about_lengths(warm):
    cfg = config(num_iterations=1)
    model, tokenizer, rows = fresh(warm)
    good, _, _ = fresh(warm)
    bug = train_with_bug(model, tokenizer, length_reward, rows, cfg, 2, bug="no_eos_mask")
    ok = train_with_bug(good, tokenizer, length_reward, rows, cfg, 2)
    # the rollouts of step 1 are identical (same weights, same seed); some stopped early
    assert ok[0]["completion_len_mean"] < cfg.max_new_tokens
    assert ok[0]["frac_truncated"] == bug[0]["frac_truncated"] < 1.0
    assert bug[0]["completion_len_mean"] == bug[0]["completion_len_max"] == cfg.max_new_tokens
    assert bug[0]["grad_after_eos"] > 0
    assert ok[0]["grad_after_eos"] == 0


def test_recomputed_old_logp_never_clips(warm):
    cfg = config(num_iterations=3, learning_rate=3e-2)
    model, tokenizer, rows = fresh(warm)
    good, _, _ = fresh(warm)
    bug = train_with_bug(model, tokenizer, length_reward, rows, cfg, 2, bug="old_logp_recomputed")
    ok = train_with_bug(good, tokenizer, length_reward, rows, cfg, 2)
    assert all(r["clip_frac"] == 0.0 and r["ratio_max"] == pytest.approx(1.0, abs=1e-6) for r in bug)
    assert max(r["ratio_max"] for r in ok) > 1.0 + 1e-3
    assert not same(params(model), params(fresh(warm)[0]))  # it does train, unprotected


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(bug="typo"), "bug"),
        (dict(step=-1), "step"),
        (dict(step=True), "step"),
    ],
)
def test_gallery_step_rejects_bad_arguments(warm, kwargs, match):
    model, tokenizer, rows = fresh(warm)
    cfg = config()
    args = dict(step=0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        gallery_step(model, tokenizer, length_reward, rows[:4], cfg, *make_optimizer(model, cfg), **args)


#: A value other than the default for every field the gallery refuses (a new refused field needs one here).
REFUSED_VALUES = {
    "minibatch_size": 4, "micro_batch_size": 4, "top_entropy_quantile": 0.5, "entropy_coef": 0.1,
    "use_adaptive_entropy": True, "dynamic_sampling": True, "multi_objective_aggregation": "normalize_then_sum",
    "ref_sync_every": 2, "log_completions": True, "use_peft": True, "sampler": "bfloat16",
    "vllm_importance_sampling_correction": True,
}


@pytest.mark.parametrize("field", sorted(GALLERY_REFUSES))
def test_gallery_refuses_each_setting_it_does_not_implement_naming_the_field(warm, field):
    model, tokenizer, rows = fresh(warm)
    cfg = config(**{field: REFUSED_VALUES[field]})
    with pytest.raises(ValueError, match=rf"config\.{field}=.*the bug gallery's step needs {field}="):
        train_with_bug(model, tokenizer, length_reward, rows, cfg, 1)
    with pytest.raises(ValueError, match=rf"config\.{field}="):
        gallery_step(model, tokenizer, length_reward, rows[:4], cfg, *make_optimizer(model, cfg), step=0)


def test_whole_batch_minibatch_and_micro_batch_sizes_are_accepted(warm):
    model, tokenizer, rows = fresh(warm)
    train_with_bug(model, tokenizer, length_reward, rows, config(minibatch_size=16, micro_batch_size=16), 1)


def test_every_config_field_is_implemented_refused_or_loop_only():
    import dataclasses

    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    groups = (GALLERY_IMPLEMENTS, set(GALLERY_REFUSES), GALLERY_IGNORES)
    assert set().union(*groups) == fields
    assert sum(len(g) for g in groups) == len(fields)  # disjoint


def half_length_reward(completions, **kwargs):
    return [0.5 * len(c) + (1.0 if c[:1] == "1" else 0.0) for c in completions]


def column_reward(completions, offset, completion_ids, **kwargs):
    """Reads an extra dataset column and the token ids: the trainer passes both to reward functions, so must the gallery."""
    return [float(len(ids)) + float(o) for ids, o in zip(completion_ids, offset)]


#: Settings the gallery takes, each checked against the trainer (non-default values; mu = 2 throughout).
IMPLEMENTED_CASES = {
    "bnpo": dict(loss_type="bnpo"),
    "dapo_clip_higher": dict(loss_type="dapo", clip_eps=0.1, clip_eps_high=0.3),
    "dr_grpo": dict(loss_type="dr_grpo", scale_rewards="none"),
    "cispo_sequence": dict(loss_type="cispo", clip_eps_high=2.0, importance_sampling_level="sequence"),
    "sapo": dict(loss_type="sapo", sapo_temperature_pos=0.7, sapo_temperature_neg=1.3),
    "luspo": dict(loss_type="luspo", importance_sampling_level="sequence"),
    "vespo": dict(loss_type="vespo", vespo_k_pos=1.5, vespo_lambda_pos=2.0, vespo_k_neg=2.5, vespo_lambda_neg=1.5),
    "delta": dict(delta=1.3),
    "kl_k2": dict(beta=0.05, kl_kind="k2"),
    "kl_bias_corrected": dict(beta=0.05, use_bias_correction_kl=True),
    "rloo_population": dict(advantage_baseline="rloo", std="population"),
    "reinforce_pp": dict(advantage_baseline="batch", scale_rewards="batch"),
    "truncation_mask": dict(mask_truncated_completions=True, max_new_tokens=2, loss_type="dapo"),
    "off_policy_mask": dict(off_policy_mask_threshold=0.0),
    "warmup_decay": dict(warmup_steps=2, weight_decay=0.1, learning_rate=2e-2),
    "no_clip_full_pass": dict(max_grad_norm=None, share_prompt_cache=False, onednn_generation=False),
    "sampling": dict(temperature=0.7, seed=5, group_size=2, prompts_per_step=6, disable_dropout=False),
    "prompting": dict(use_chat_template=False, system_prompt=None, num_iterations=3),
    "weights": dict(reward_weights=[1.0, 0.5]),
    "static_cache_off": dict(static_cache=False),  # the policy's own sampler, as on a CPU (True: a GPU's)
    "extra_column": dict(),
}
#: Implemented fields whose only legal value is the default (top_p must be 1.0 to train).
ONLY_DEFAULT = {"top_p"}


def test_every_implemented_field_has_a_case_against_the_trainer():
    covered = set().union(*IMPLEMENTED_CASES.values())
    base_changed = {k for k, v in config().to_dict().items() if GRPOConfig().to_dict()[k] != v}  # in every case
    assert GALLERY_IMPLEMENTS - covered - base_changed - ONLY_DEFAULT == set()


@pytest.mark.parametrize("case", sorted(IMPLEMENTED_CASES))
def test_correct_step_is_the_trainer_step_for_every_setting_it_takes(warm, case):
    cfg = config(**IMPLEMENTED_CASES[case])
    m1, tokenizer, rows = fresh(warm)
    m2, _, _ = fresh(warm)
    fns = [length_reward]
    if case == "weights":
        fns = [length_reward, half_length_reward]
    if case == "extra_column":
        fns = [column_reward]
        rows = [{**row, "offset": i % 3} for i, row in enumerate(rows)]
    ref = copy.deepcopy(m1) if cfg.beta > 0 else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GRPOWarning)
        expected = GRPOTrainer(m1, tokenizer, fns, cfg, ref_model=ref).train(rows, 2, progress=False)
        # the gallery scores the reference it is given; frozen as the trainer freezes its own
        frozen = None if ref is None else copy.deepcopy(m2).eval().requires_grad_(False)
        got = train_with_bug(m2, tokenizer, fns, rows, cfg, 2, ref_model=frozen)
    for a, b in zip(expected, got):
        assert set(b) - set(a) == EXTRA_KEYS
        for key in a:
            if key in TIMING_KEYS or key in ("lr", "skipped_updates", "groups_drawn"):
                continue
            assert a[key] == b[key] or (math.isnan(a[key]) and math.isnan(b[key])), (case, key, a[key], b[key])
    assert same(params(m1), params(m2)), case


def test_train_with_bug_checks_steps_and_dataset(warm):
    model, tokenizer, rows = fresh(warm)
    with pytest.raises(ValueError, match="steps"):
        train_with_bug(model, tokenizer, length_reward, rows, config(), 0)
    with pytest.raises(ValueError, match="dataset"):
        train_with_bug(model, tokenizer, length_reward, [], config(), 1)
    with pytest.raises(TypeError, match="config"):
        train_with_bug(model, tokenizer, length_reward, rows, {"group_size": 4}, 1)


def test_all_bugs_are_listed():
    assert BUGS == ("none", "no_grad", "ref_as_old", "sequence_ratio", "no_eos_mask", "old_logp_recomputed")


#: GRPOStep's methods, by the stage whose work they do (issue 44: the gallery's bugs override one stage each).
STEP_METHODS = {
    1: {"sample"}, 2: {"reward"}, 3: {"advantages"}, 4: {"score", "logprobs"},
    5: {"update", "accumulate", "policy_logprobs", "loss"},
}


def test_the_clean_gallery_step_is_the_trainers_and_each_bug_overrides_one_stage():
    from grpo_tutorial.chapters.pitfalls import GALLERY_BUGS, GalleryStep
    from grpo_tutorial.step import GRPOStep

    assert tuple(GALLERY_BUGS) == BUGS and GALLERY_BUGS["none"] is GalleryStep
    assert issubclass(GalleryStep, GRPOStep) and "__call__" not in vars(GalleryStep)  # the trainer's step itself
    stages = {}
    for bug, cls in GALLERY_BUGS.items():
        if bug == "none":
            continue
        assert cls.__bases__ == (GalleryStep,), bug
        overridden = {name for name in vars(cls) if not name.startswith("__")}
        stages[bug] = {n for n, methods in STEP_METHODS.items() if overridden & methods}
        assert overridden <= set().union(*STEP_METHODS.values()), (bug, overridden)
    assert stages == {"no_grad": {5}, "ref_as_old": {4}, "sequence_ratio": {5}, "no_eos_mask": {5},
                      "old_logp_recomputed": {4}}


# -------------------------------------------------------------- right padding


def test_right_padding_continues_after_pad_tokens(warm):
    model, tokenizer, _ = fresh(warm)
    prompts = ["3+5=", "12+34="]
    with captured_logs() as logs:
        wrong = generate_right_padded(model, tokenizer, prompts, max_new_tokens=3)
    assert any("right-padding was detected" in m for m in logs)
    right = generate_rollouts(model, tokenizer, prompts, group_size=1, max_new_tokens=3, do_sample=False)
    # the longest prompt has no padding either way, so its completion is the same
    assert wrong[1] == right.completions[1]
    # the short one is continued from a pad position: its next-token distribution differs
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="right")
    with torch.no_grad():
        logits = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask).logits  # [2, T, V]
    n_real = int(enc.attention_mask[0].sum())
    at_pad, at_prompt_end = logits[0, -1], logits[0, n_real - 1]
    assert (at_pad - at_prompt_end).abs().max() > 1e-3


def test_equal_length_prompts_need_no_padding(warm):
    model, tokenizer, _ = fresh(warm)
    prompts = ["3+5=", "7+1="]
    with captured_logs() as logs:
        wrong = generate_right_padded(model, tokenizer, prompts, max_new_tokens=3)
    assert logs == []
    right = generate_rollouts(model, tokenizer, prompts, group_size=1, max_new_tokens=3, do_sample=False)
    assert wrong == right.completions


def test_generate_right_padded_checks_arguments(warm):
    model, tokenizer, _ = fresh(warm)
    with pytest.raises(TypeError, match="prompts"):
        generate_right_padded(model, tokenizer, "3+5=", max_new_tokens=2)
    with pytest.raises(TypeError, match="prompts"):
        generate_right_padded(model, tokenizer, [3, 5], max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_right_padded(model, tokenizer, ["3+5="], max_new_tokens=0)


def test_captured_logs_collects_and_restores():
    logger = logging.getLogger("transformers")
    handlers, propagate = logger.handlers[:], logger.propagate
    with captured_logs() as logs:
        logging.getLogger("transformers.some.module").warning("careful: %d", 3)
        logging.getLogger("transformers.some.module").info("not collected")
    assert logs == ["careful: 3"]
    assert logger.handlers == handlers and logger.propagate == propagate
    with pytest.raises(ValueError, match="name"):
        with captured_logs(""):
            pass


@pytest.mark.parametrize("bad, kind", [("1+1=", TypeError), ([], ValueError), ([{"answer": "2"}], ValueError), (["1+1="], TypeError)])
def test_a_malformed_batch_raises_the_same_error_in_the_gallery_and_the_trainer(bad, kind, tiny_policy):
    model, tok = tiny_policy
    cfg = GRPOConfig(prompts_per_step=1, group_size=2)
    errors = []
    for run in (lambda: GRPOTrainer(model, tok, length_reward, cfg).train_step(bad),
                lambda: gallery_step(model, tok, length_reward, bad, cfg, *make_optimizer(model, cfg), step=0)):
        with pytest.raises(Exception) as err:
            run()
        errors.append((type(err.value), str(err.value)))
    assert errors[0] == errors[1] and errors[0][0] is kind
