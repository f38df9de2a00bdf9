"""Part c: model FLOPs utilisation (MFU) of the package's forward and backward pass.

MFU is the FLOPs a model's training step needs, per second, divided by the peak
FLOPs per second of the hardware. Here:

* the peak is *measured*: the speed of a large float32 ``torch.mm`` (2048 x 2048
  by default, 2 n^3 FLOPs each) at the same thread count, measured again right
  before each timed pass, and each pass is divided by its own peak;
* the pass is what the package's trainer does for each minibatch:
  ``completion_logprobs`` -> ``grpo_loss`` -> ``backward``, on B*G rows of prompt
  plus completion tokens;
* the FLOPs are counted two ways.

``6ND``
    The usual rule of thumb, 6 x parameters x tokens (2 for the forward pass and 4
    for the backward pass, per parameter and token).
``counted``
    What the pass really multiplies: the non-embedding weights on every token; the
    output layer only on the completion positions, because ``completion_logprobs``
    asks the model for ``logits_to_keep = Tc + 1`` positions; plus attention's
    T x T products (12 L T^2 d per row for the forward and backward passes). An
    embedding lookup is not a multiplication and is not counted. For a model whose
    output layer is large (SmolLM2's vocabulary has 49,152 tokens), ``6ND``
    overstates the work, and with it the MFU.

An op-level profile of one pass (``torch.profiler``) says where the time goes.

The batch holds B prompts, each G times, as a GRPO batch does. MFU is measured on
the plain pass (every row scored in full: the model's own forward and backward,
the figure the target is about). The trainer's default pass encodes each prompt
once (``share_prompts=True``); it is timed too, and its MFU uses the FLOPs it
really multiplies (:func:`shared_flop_counts`): it does less work, so its
seconds, not its MFU, are the point.
"""

from __future__ import annotations

from typing import Any

import torch

from grpo_tutorial.logprobs import completion_logprobs
from grpo_tutorial.loss import grpo_loss
from grpo_tutorial.rollout import render_prompts
from grpo_tutorial.tasks import make_arithmetic_dataset

from .common import summarize, timed


def matmul_peak(n: int = 2048, repeats: int = 10, warmup: int = 2) -> dict[str, Any]:
    """GFLOP/s of an n x n float32 matmul: median, min and max over ``repeats``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen)  # [n, n]
    b = torch.randn(n, n, generator=gen)  # [n, n]
    out = torch.empty(n, n)  # [n, n]
    for _ in range(warmup):
        torch.mm(a, b, out=out)
    gflops = [2 * n**3 / timed(lambda: torch.mm(a, b, out=out))[0] / 1e9 for _ in range(repeats)]
    return {"n": n, "gflops": summarize(gflops)}


def scoring_batch(
    tokenizer: Any, vocab_size: int, rows: int, completion_len: int, style: str, seed: int = 0, group_size: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Real prompts (chat template where the model has one), left-padded, then random completions.

    ``rows / group_size`` distinct prompts, each repeated ``group_size`` times, group by group.
    Returns input_ids [rows, Tp+Tc] and attention_mask [rows, Tp+Tc].
    """
    if rows % group_size:
        raise ValueError(f"group_size {group_size} must divide rows {rows}")
    distinct = make_arithmetic_dataset(rows // group_size, seed=seed, digits=1 if style == "question" else 2, style=style)
    prompts = [r["prompt"] for r in distinct for _ in range(group_size)]
    texts = render_prompts(tokenizer, prompts)
    has_template = bool(getattr(tokenizer, "chat_template", None))
    enc = tokenizer(texts, add_special_tokens=not has_template, padding=True, padding_side="left", return_tensors="pt")
    gen = torch.Generator().manual_seed(seed)
    completion = torch.randint(0, vocab_size, (rows, completion_len), generator=gen)  # [rows, Tc]
    input_ids = torch.cat([enc["input_ids"], completion], dim=1)  # [rows, Tp+Tc]
    attention_mask = torch.cat([enc["attention_mask"], torch.ones_like(completion)], dim=1)  # [rows, Tp+Tc]
    return input_ids, attention_mask


def _model_sizes(model: torch.nn.Module) -> dict[str, Any]:
    """Parameter counts (all, non-embedding, output layer), tying, and attention's shape."""
    params = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    tied = head is embed
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return {
        "parameters": params,
        "body": params - embed.numel() - (0 if tied else head.numel()),
        "head": head.numel(),
        "tied": tied,
        "layers": cfg.num_hidden_layers,
        "attn_width": cfg.num_attention_heads * head_dim,
    }


def flop_counts(model: torch.nn.Module, rows: int, seq_len: int, completion_len: int) -> dict[str, float]:
    """FLOPs of one forward + backward pass: the 6ND rule and the counted matmuls."""
    size = _model_sizes(model)
    params, body, head = size["parameters"], size["body"], size["head"]
    tokens = rows * seq_len
    scored = rows * (completion_len + 1)  # logits_to_keep = Tc + 1
    attention = 12 * size["layers"] * rows * seq_len**2 * size["attn_width"]
    return {
        "parameters": params,
        "non_embedding_parameters": body,
        "output_layer_parameters": head,
        "tied_embeddings": size["tied"],
        "tokens": tokens,
        "scored_positions": scored,
        "flops_6nd": 6.0 * params * tokens,
        "flops_counted": 6.0 * body * tokens + 6.0 * head * scored + attention,
    }


def shared_flop_counts(model: torch.nn.Module, rows: int, prompts: int, prompt_len: int, completion_len: int) -> float:
    """Counted FLOPs of the shared-prompt forward + backward pass (see ``speedups.shared_prompt_logits``).

    The ``prompts`` distinct prompts go through once (their output layer on one
    position each); then every row's first Tc - 1 completion tokens, attending to
    Tp + Tc - 1 keys.
    """
    size = _model_sizes(model)
    tc = completion_len - 1
    tokens = prompts * prompt_len + rows * tc
    scored = prompts + rows * tc
    keys = prompts * prompt_len**2 + rows * tc * (prompt_len + tc)  # query x key products
    return 6.0 * size["body"] * tokens + 6.0 * size["head"] * scored + 12 * size["layers"] * size["attn_width"] * keys


def forward_backward(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_len: int,
    share_prompts: bool = False,
) -> None:
    """One minibatch of the trainer's update, without the optimizer: log-probs, GRPO loss, backward."""
    model.zero_grad(set_to_none=True)
    logp = completion_logprobs(model, input_ids, attention_mask, completion_len, share_prompts=share_prompts)  # [N, Tc]
    rows = input_ids.shape[0]
    advantages = torch.linspace(-1.0, 1.0, rows)  # [N]
    mask = torch.ones_like(logp)  # [N, Tc]
    loss, _ = grpo_loss(logp, logp.detach(), advantages, mask)
    loss.backward()


def top_ops(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_len: int, k: int = 10) -> list[dict[str, Any]]:
    """The k ops with the most self CPU time in one profiled pass, with their share."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        forward_backward(model, input_ids, attention_mask, completion_len)
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return [
        {"op": e.key, "self_ms": e.self_cpu_time_total / 1000, "share": e.self_cpu_time_total / total, "calls": e.count}
        for e in events[:k]
    ]


def run(
    model: torch.nn.Module,
    tokenizer: Any,
    *,
    model_name: str,
    rows: int,
    completion_len: int,
    group_size: int = 8,
    repeats: int = 3,
    peak_n: int = 2048,
    peak_repeats: int = 10,
    profile_ops: bool = True,
) -> dict[str, Any]:
    """Time ``repeats`` forward + backward passes (after one warm-up) and turn them into MFU.

    The matmul peak is measured again right before every timed pass (the median of
    ``peak_repeats`` matmuls, a second or more of work, so that one unlucky
    time slice on a shared machine does not decide it), and each pass is divided
    by its own peak, so that a drift in the machine's load does not bias the ratio.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    style = "plain" if model_name == "tiny" else "question"
    input_ids, attention_mask = scoring_batch(
        tokenizer, model.config.vocab_size, rows, completion_len, style, group_size=group_size
    )
    was_training = model.training
    model.train()
    seconds, peaks, shared_seconds = [], [], []
    try:
        for share in (False, True):  # warm-up
            forward_backward(model, input_ids, attention_mask, completion_len, share)
        for _ in range(repeats):
            peaks.append(matmul_peak(peak_n, repeats=peak_repeats, warmup=1)["gflops"]["median"])
            seconds.append(timed(lambda: forward_backward(model, input_ids, attention_mask, completion_len))[0])
            shared_seconds.append(
                timed(lambda: forward_backward(model, input_ids, attention_mask, completion_len, True))[0]
            )
        ops = top_ops(model, input_ids, attention_mask, completion_len) if profile_ops else []
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    counts = flop_counts(model, rows, input_ids.shape[1], completion_len)
    prompt_len = input_ids.shape[1] - completion_len
    shared_flops = shared_flop_counts(model, rows, rows // group_size, prompt_len, completion_len)
    result: dict[str, Any] = {
        "model": model_name,
        "rows": rows,
        "seq_len": input_ids.shape[1],
        "completion_len": completion_len,
        **counts,
        "seconds": summarize(seconds),
        "peak_gflops": summarize(peaks),
        "top_ops": ops,
    }
    for kind in ("6nd", "counted"):
        achieved = [counts[f"flops_{kind}"] / s / 1e9 for s in seconds]
        result[f"gflops_{kind}"] = summarize(achieved)
        result[f"mfu_{kind}"] = summarize([g / p for g, p in zip(achieved, peaks)])
    shared_gflops = [shared_flops / s / 1e9 for s in shared_seconds]
    result["shared_prompts"] = {
        "group_size": group_size,
        "flops_counted": shared_flops,
        "seconds": summarize(shared_seconds),
        "speedup": summarize([a / b for a, b in zip(seconds, shared_seconds)]),
        "gflops_counted": summarize(shared_gflops),
        "mfu_counted": summarize([g / p for g, p in zip(shared_gflops, peaks)]),
    }
    result["target"] = 0.5
    return result
