"""Chapter 9's GPU estimates: how long a step and a session take on a T4, and how much memory they need.

The GPU run of :mod:`grpo_tutorial.chapters.gsm8k` is sized by these, from first
principles and from ``make gpu-proof``'s measured step (``gpu_proof.json``):

- :func:`estimate_step_seconds` is a roofline estimate of one step's time from
  the FLOPs of generation and training and a GPU's peak FLOP rate and memory
  bandwidth (:data:`T4_FP32_FLOPS`, :data:`T4_BANDWIDTH`; :func:`published_peaks` for other GPUs);
- :func:`t4_step_estimate`, :func:`t4_run_estimate`, :func:`session_estimate` and :func:`t4_memory_estimate`
  carry ``make gpu-proof``'s measured step to a T4: the step of the mode the config
  trains (LoRA or full fine-tuning, :func:`step_mode`) and the sampler it generates with on a GPU
  (:func:`gpu_sampler`), refusing (:class:`MissingMeasurement`) where the record
  lacks either; :func:`chapter9_estimate` is what chapter 9 prints from any record.

:mod:`grpo_tutorial.chapters.gsm8k` re-exports every name, so ``from grpo_tutorial.chapters.gsm8k import
chapter9_estimate`` still works.
"""

from __future__ import annotations

from .._checks import check_flag, check_int, check_number
from ..config import GRPOConfig

__all__ = [
    "COMPILE_SLOWDOWN",
    "GPU_PEAKS",
    "HOST_SLOWDOWN",
    "MissingMeasurement",
    "SAMPLER_LABELS",
    "SETUP_MINUTES",
    "STAGES_BEFORE",
    "T4_BANDWIDTH",
    "T4_CAP_BYTES",
    "T4_CONTEXT_BYTES",
    "T4_FP32_FLOPS",
    "T4_TOTAL_BYTES",
    "chapter9_estimate",
    "estimate_step_seconds",
    "forward_flops_per_token",
    "gpu_sampler",
    "lora_trainable_params",
    "measured_mode",
    "measured_sampler",
    "measured_samplers",
    "published_peaks",
    "sampler_name",
    "session_estimate",
    "stage_names",
    "step_mode",
    "t4_memory_estimate",
    "t4_run_estimate",
    "t4_step_estimate",
]

#: NVIDIA T4, published peak: 8.1 TFLOP/s in float32 (no tensor cores in fp32).
T4_FP32_FLOPS = 8.1e12
#: NVIDIA T4, published memory bandwidth: 320 GB/s (GDDR6).
T4_BANDWIDTH = 320e9
#: What PyTorch reports as a Colab T4's total memory (``torch.cuda.get_device_properties``;
#: "GPU 0 has a total capacity of 14.56 GiB" in its out-of-memory messages) ...
T4_TOTAL_BYTES = int(14.56 * 2**30)
#: ... less about half a GiB that the CUDA context takes there outside PyTorch's allocator.
T4_CONTEXT_BYTES = 2**30 // 2
#: What a T4 leaves PyTorch: the cap ``make gpu-proof`` puts on its allocator, and chapter 9's.
T4_CAP_BYTES = T4_TOTAL_BYTES - T4_CONTEXT_BYTES


# ---------------------------------------------------------------------------
# How long a step takes on a GPU: a roofline estimate
# ---------------------------------------------------------------------------


def forward_flops_per_token(num_params: int, vocab_size: int, hidden_size: int, *, tied_embeddings: bool) -> int:
    """FLOPs of one token's forward pass: 2 per weight that takes part in a matrix product.

    Every weight does, except the input embedding, which is a table lookup. A
    model with tied embeddings uses that same matrix again as its output layer,
    so all ``num_params`` count; an untied one has a separate output matrix
    (already in ``num_params``) and the lookup table does not count. Attention's
    own products (scores and weighted values, which grow with the context) and
    the norms are left out: for Qwen2.5-0.5B at 400 tokens they add about 3%.

    >>> forward_flops_per_token(100, 10, 2, tied_embeddings=True)
    200
    >>> forward_flops_per_token(100, 10, 2, tied_embeddings=False)
    160
    """
    check_int(None, "num_params", num_params, 1)
    check_int(None, "vocab_size", vocab_size, 1)
    check_int(None, "hidden_size", hidden_size, 1)
    if not isinstance(tied_embeddings, bool):
        raise TypeError(f"tied_embeddings must be a bool, got {tied_embeddings!r}")
    matmul_params = num_params if tied_embeddings else num_params - vocab_size * hidden_size
    if matmul_params < 1:
        raise ValueError(
            f"num_params={num_params} is not more than the embedding table vocab_size*hidden_size="
            f"{vocab_size * hidden_size}; check the numbers"
        )
    return 2 * matmul_params


def estimate_step_seconds(
    *,
    num_params: int,
    vocab_size: int,
    hidden_size: int,
    tied_embeddings: bool,
    prompts: int,
    group_size: int,
    prompt_tokens: int,
    completion_tokens: int,
    num_iterations: int = 1,
    minibatches: int = 1,
    gradient_checkpointing: bool = True,
    reference_model: bool = False,
    share_prompt_cache: bool = True,
    lora: bool = False,
    weight_bytes: int = 4,
    peak_flops: float = T4_FP32_FLOPS,
    bandwidth: float = T4_BANDWIDTH,
) -> dict[str, float]:
    """A roofline estimate of one GRPO step's seconds on a GPU (a lower bound), pass by pass as the trainer runs them.

    The forward FLOPs per token split into the *body* (every matrix product but
    the output layer: ``2 * (num_params - V*H)``, or ``- 2*V*H`` untied) and the
    *head* (the output layer, ``2*V*H``), because the trainer runs them over
    different positions. With ``B`` prompts, ``R = B * G`` rows, ``P`` prompt
    and ``C`` completion tokens per row (every row padded to the longest
    completion, so ``C`` is the budget in the worst case) and ``W =
    num_params * weight_bytes`` bytes of weights:

    - **generation** (:func:`~grpo_tutorial.rollout.generate_rollouts`): each
      distinct prompt is encoded once (the body over ``B * (P - 1)`` tokens, the
      head at one position), then ``C`` decoding forwards of one token for each
      of the ``R`` rows. Each forward reads all weights once, so it takes
      ``max(FLOPs / peak_flops, W / bandwidth)``: decoding a few dozen rows is
      limited by memory, not arithmetic.
    - **training** (compute-bound): each of the ``num_iterations * minibatches``
      updates runs a forward over its rows (the body over prompt and completion,
      the head only at the ``C + 1`` completion positions the scorer keeps), a
      backward of twice its FLOPs and, with gradient checkpointing, the body's
      forward once more. An off-policy step (more than one update) first scores
      the old policy in a no-grad forward; a reference model (``beta > 0``) adds
      one more. An on-policy step (one update) has no old-policy pass: its old
      log-probs are the gradient pass's own. With ``share_prompt_cache`` a
      pass encodes each prompt once instead of ``G`` times (a lower bound: a
      pass split into shuffled micro-batches encodes the prompts present in
      each), except the gradient passes under checkpointing, which fall back to
      full rows (the no-grad passes run in eval mode and still share).
      With ``lora`` the weights are frozen (LoRA adapters train instead): the
      backward computes the gradients of the activations only, one forward's
      FLOPs instead of two (the adapters' own small products are left out).

    It assumes every unit runs at its peak, and leaves out the per-token overhead
    of a generate loop, the KV-cache reads, attention's own products and the
    optimizer; real steps are slower, and where the time goes in a real step
    (Python's loop around each generated token, kernel launches) is not in it.

    Returns ``generate_flops``, ``train_flops``, ``generate_seconds``,
    ``train_seconds``, ``seconds`` (their sum), and the token counts behind
    them: ``generate_body_tokens``, ``generate_head_tokens``,
    ``train_body_tokens``, ``train_head_tokens`` (forward positions, summed over
    the step's passes, a backward counted once as its forward),
    ``train_recomputed_tokens`` and ``passes`` (the forward passes over the
    batch: ``"old"``, ``"reference"``, ``"update"``).
    """
    f = forward_flops_per_token(num_params, vocab_size, hidden_size, tied_embeddings=tied_embeddings)
    for name, value in (
        ("prompts", prompts),
        ("group_size", group_size),
        ("prompt_tokens", prompt_tokens),
        ("completion_tokens", completion_tokens),
        ("num_iterations", num_iterations),
        ("minibatches", minibatches),
        ("weight_bytes", weight_bytes),
    ):
        check_int(None, name, value, 1)
    for name, value in (
        ("gradient_checkpointing", gradient_checkpointing),
        ("reference_model", reference_model),
        ("share_prompt_cache", share_prompt_cache),
        ("lora", lora),
    ):
        check_flag(None, name, value)
    peak = check_number(None, "peak_flops", peak_flops, lambda v: v > 0, "a positive number")
    bw = check_number(None, "bandwidth", bandwidth, lambda v: v > 0, "a positive number")

    head = 2 * vocab_size * hidden_size  # the output layer, per position
    body = f - head  # everything else, per token
    B, R, P, C = prompts, prompts * group_size, prompt_tokens, completion_tokens
    weight_read = num_params * weight_bytes / bw  # seconds to stream the weights once

    # generation: the prompts once (all but their last token), then C one-token forwards of R rows
    prefill_body, prefill_head = B * (P - 1), B
    prefill_flops = body * prefill_body + head * prefill_head
    decode_flops = (body + head) * R
    generate_seconds = max(prefill_flops / peak, weight_read) + C * max(decode_flops / peak, weight_read)
    generate_flops = prefill_flops + C * decode_flops

    def scoring_pass(shared: bool) -> tuple[int, int]:
        """(body tokens, head positions) of one pass over all R rows, as completion_logprobs runs it."""
        if shared and C > 1:  # prompts once (head at their last position), then C - 1 completion tokens per row
            return B * P + R * (C - 1), B + R * (C - 1)
        return R * (P + C), R * (C + 1)  # full rows; the head keeps C + 1 positions

    updates = num_iterations * minibatches
    passes = {"old": int(updates > 1), "reference": int(reference_model), "update": num_iterations}
    eval_body, eval_head = scoring_pass(share_prompt_cache)  # no-grad passes run in eval mode
    grad_body, grad_head = scoring_pass(share_prompt_cache and not gradient_checkpointing)
    no_grad_passes = passes["old"] + passes["reference"]
    recomputed = num_iterations * grad_body if gradient_checkpointing else 0
    train_body = no_grad_passes * eval_body + num_iterations * grad_body
    train_head = no_grad_passes * eval_head + num_iterations * grad_head
    train_flops = (
        no_grad_passes * (body * eval_body + head * eval_head)
        # forward + backward: 2x the forward (activations and weights), or 1x with frozen weights (LoRA)
        + num_iterations * (2 if lora else 3) * (body * grad_body + head * grad_head)
        + body * recomputed  # checkpointing: the layers' forward again during the backward
    )
    train_seconds = train_flops / peak
    return {
        "generate_flops": float(generate_flops),
        "train_flops": float(train_flops),
        "generate_seconds": generate_seconds,
        "train_seconds": train_seconds,
        "seconds": generate_seconds + train_seconds,
        "generate_body_tokens": prefill_body + C * R,
        "generate_head_tokens": prefill_head + C * R,
        "train_body_tokens": train_body,
        "train_head_tokens": train_head,
        "train_recomputed_tokens": recomputed,
        "passes": passes,
    }


# ---------------------------------------------------------------------------
# A step measured on another GPU, scaled to a T4
# ---------------------------------------------------------------------------

#: Published peaks of GPUs that ``make gpu-proof`` may run on: (name as CUDA reports it
#: contains this, float32 FLOP/s without tensor cores, memory bandwidth in bytes/s), from
#: NVIDIA's data sheets. The first match wins, so "H100 PCIe" comes before "H100" (SXM5, HBM3).
GPU_PEAKS = (
    ("H100 PCIe", 51.2e12, 2.0e12),
    ("H100", 66.9e12, 3.35e12),
    ("H200", 66.9e12, 4.8e12),
    ("A100", 19.5e12, 2.039e12),
    ("L4", 30.3e12, 300e9),
    ("T4", T4_FP32_FLOPS, T4_BANDWIDTH),
)

def published_peaks(device_name: str) -> tuple[float, float]:
    """``(float32 FLOP/s, bytes/s)`` of the GPU named ``device_name`` (:data:`GPU_PEAKS`).

    >>> published_peaks("Tesla T4") == (T4_FP32_FLOPS, T4_BANDWIDTH)
    True
    """
    if not isinstance(device_name, str):
        raise TypeError(f"device_name must be a str, got {type(device_name).__name__}")
    for key, flops, bandwidth in GPU_PEAKS:
        if key in device_name:
            return flops, bandwidth
    raise ValueError(f"no published peaks for {device_name!r}; known: {[key for key, _, _ in GPU_PEAKS]}")


# ---------------------------------------------------------------------------
# What an estimate reads: the mode and the sampler the config runs
# ---------------------------------------------------------------------------

#: How ``make gpu-proof`` names what generates a rollout, by the model that samples: ``plain`` (every weight
#: trained, or LoRA's adapters merged into a copy: a plain float32 model), ``lora`` (the PEFT model, adapters
#: unmerged), ``float16`` (the float16 sampler copy); ``_static`` with the static KV cache, compiled on CUDA.
SAMPLER_LABELS = {
    "plain": "float32, dynamic cache (every weight trained, or LoRA merged into a copy)",
    "lora": "float32, LoRA adapters unmerged, dynamic cache (every sampler before issue 43)",
    "plain_static": "float32, static cache compiled (LoRA merged into a copy): the GPU default",
    "lora_static": "float32, LoRA unmerged, static cache compiled",
    "float16": "float16 copy, dynamic cache",
    "float16_static": "float16 copy, static cache compiled",
}


class MissingMeasurement(ValueError):
    """The GPU record lacks what an estimate needs (the config's mode, or its sampler): the estimate refuses.

    It never borrows another mode's or another sampler's numbers; the message names
    what is missing and what the record has.
    """


def step_mode(config: GRPOConfig) -> str:
    """The record's mode for ``config``: ``"lora"`` with ``use_peft``, else ``"full"``."""
    return "lora" if config.use_peft else "full"


def sampler_name(config: GRPOConfig, on_gpu: bool) -> str:
    """The name (:data:`SAMPLER_LABELS`) of what ``config`` samples with, on a CUDA GPU or not.

    ``merge_adapters_for_sampling`` and ``static_cache`` of None are on on a GPU
    only (:mod:`grpo_tutorial.sampling.fast`). A sampler copy of chapter 15 other
    than float16 is named by ``GRPOConfig.sampler`` itself.

    >>> sampler_name(GRPOConfig(use_peft=True), on_gpu=True), sampler_name(GRPOConfig(use_peft=True), on_gpu=False)
    ('plain_static', 'lora')
    """
    if config.sampler not in ("policy", "float16"):
        return config.sampler
    merge = on_gpu if config.merge_adapters_for_sampling is None else config.merge_adapters_for_sampling
    static = on_gpu if config.static_cache is None else config.static_cache
    kind = "float16" if config.sampler == "float16" else "lora" if config.use_peft and not merge else "plain"
    return kind + ("_static" if static else "")


def gpu_sampler(config: GRPOConfig) -> str:
    """The name (:data:`SAMPLER_LABELS`) of what ``config`` samples with on a CUDA GPU (:func:`sampler_name`).

    The LoRA preset's is ``"plain_static"``: the adapters merged into a copy, the static cache.

    >>> gpu_sampler(GRPOConfig(use_peft=True, static_cache=False, merge_adapters_for_sampling=False))
    'lora'
    """
    name = sampler_name(config, on_gpu=True)
    if name not in SAMPLER_LABELS:
        raise ValueError(f"GRPOConfig.sampler={config.sampler!r}: the T4 estimates know the policy's own sampling and "
                         "the float16 copy; estimate with sampler='policy'")
    return name


#: A GPU record's stages are named as the history's timing keys, less ``_seconds`` (``sample``, ``reward``,
#: ``forward``, ``backward``, ``optimizer``: stage 1, stage 2 and stage 5's three parts); records made before
#: issue 44 (the committed one among them) name three of them otherwise, and read under these names.
STAGES_BEFORE = {"generation": "sample", "scoring_forward": "forward", "optimizer_step": "optimizer"}


def stage_names(step: dict) -> dict:
    """``step`` (a record's measured step) with its stages under today's names, whichever names it was written with."""
    if "stages" not in step:
        return step
    return {**step, "stages": {STAGES_BEFORE.get(name, name): stage for name, stage in step["stages"].items()}}


def measured_mode(record: dict, config: GRPOConfig) -> dict:
    """The record's measured step for ``config``'s mode (:func:`step_mode`), or :class:`MissingMeasurement`.

    A dry run (made on a CPU) measured no GPU, and a mode that is absent or was not
    measured (a record made before LoRA could be measured, an out-of-memory step)
    cannot stand for the other one: a LoRA step samples and trains at other speeds.
    Its steps' stages read under today's names (:func:`stage_names`).
    """
    mode, made = step_mode(config), f"made at {str(record.get('package_commit'))[:10]} on {record['device']['name']}"
    if record.get("dry_run") or record["device"].get("type") != "cuda":
        raise MissingMeasurement(f"the GPU record ({made}) is a dry run on a CPU: it measured no GPU step to scale to a "
                                 "T4. Run `make gpu-proof` on a CUDA GPU")
    entry = record["qwen_step"]["modes"].get(mode)
    status = "absent" if entry is None else entry.get("status")
    if status != "measured":
        error = f": {entry['error']}" if entry and entry.get("error") else ""
        raise MissingMeasurement(
            f"the GPU record ({made}) has no measured {mode!r} step (status {status!r}{error}), and the estimate of a "
            f"{'LoRA' if mode == 'lora' else 'full fine-tuning'} run reads that mode only, never another's. Run "
            "`make gpu-proof` on a CUDA GPU to measure it")
    return {**entry, **{key: stage_names(entry[key]) for key in ("step", "warmup_step") if key in entry}}


def measured_sampler(record: dict, config: GRPOConfig) -> str:
    """The sampler the record's step of ``config``'s mode was measured with: its own ``sampler`` field, or, in a
    record made before issue 43 (none), the only one there was: ``"lora"`` for LoRA, ``"plain"`` otherwise."""
    entry = measured_mode(record, config)
    return entry.get("sampler") or ("lora" if step_mode(config) == "lora" else "plain")


def measured_samplers(record: dict) -> list[str]:
    """Every sampler name the record has a measurement of (its modes' steps and its sampler table)."""
    names = [entry.get("sampler") or ("lora" if mode == "lora" else "plain")
             for mode, entry in record["qwen_step"]["modes"].items() if entry.get("status") == "measured"]
    names += [name for name, m in record["qwen_step"].get("samplers", {}).items()
              if m.get("status") == "measured" and name in SAMPLER_LABELS]
    return list(dict.fromkeys(names))


def _generation_source(record: dict, config: GRPOConfig, sampler: str | None, prefix: str = "") -> dict:
    """Where an estimate's generation comes from: the mode's own step, or the record's sampler table.

    Returns ``seconds`` for ``tokens`` new tokens of ``prompts`` x ``group_size`` rows, ``compile_seconds`` (a
    static sampler's first call at a new shape, less a later call's), ``weight_bytes`` and ``source``.
    """
    entry, shapes = measured_mode(record, config), record["qwen_step"]["shapes"]
    name = gpu_sampler(config) if sampler is None else sampler
    if name not in SAMPLER_LABELS:
        raise ValueError(f"sampler={name!r} is not a sampler name; expected one of {list(SAMPLER_LABELS)}")
    weight_bytes = 2 if name.startswith("float16") else 4
    if not prefix and name == measured_sampler(record, config):
        step = entry["step"]
        generation = step["stages"]["sample"]["seconds"]
        warm = entry.get("warmup_step", {}).get("stages", {}).get("sample", {}).get("seconds", generation)
        return {"name": name, "seconds": generation, "tokens": round(step["completion_tokens_mean"]),
                "prompts": shapes["prompts"], "group_size": shapes["group_size"], "weight_bytes": weight_bytes,
                "compile_seconds": max(0.0, warm - generation) if name.endswith("_static") else 0.0,
                "source": f"the {step_mode(config)!r} step"}
    table = record["qwen_step"].get("samplers", {})  # issue 43's sampler table; absent in older records
    measured = table.get(prefix + name, {})
    if measured.get("status") != "measured":
        raise MissingMeasurement(
            f"the GPU record measured no {prefix + name!r} sampler ({SAMPLER_LABELS[name]}), which this estimate needs "
            f"({'GRPOConfig.sampler and the fast-sampler settings' if sampler is None else 'sampler='}); it has "
            f"{measured_samplers(record)}. Estimate with one of those (sampler=...), or run `make gpu-proof` on a GPU")
    return {"name": name, "seconds": measured["ms_per_step"]["median"] / 1000 * measured["new_tokens"],
            "tokens": measured["new_tokens"], "prompts": measured["prompts"], "group_size": measured["group_size"],
            "weight_bytes": weight_bytes, "compile_seconds": measured["compile_seconds"] or 0.0,
            "source": f"the record's {prefix + name!r} sampler"}


def t4_step_estimate(record: dict, mode: str = "full") -> dict:
    """An ESTIMATE of the GPU preset's step on a T4, from the step of ``mode`` measured on another GPU.

    ``record`` is ``make gpu-proof``'s (``read_data("gpu_proof.json")``), ``mode``
    ``"full"`` or ``"lora"`` (:class:`MissingMeasurement` when it was not measured). For each
    phase, generation and training (the scoring forward and the backward), the
    roofline of :func:`estimate_step_seconds` is computed for the GPU that
    measured it (its :func:`published_peaks`) and for a T4, at the measured
    shapes; the measured seconds over the first say how close that GPU came to
    its bound (``share_of_bound``). Two figures for the T4:

    - ``t4_scaled``: the measured seconds times the ratio of the two rooflines,
      as if the T4 reached the same share of its bound. Where the measuring GPU
      was far below its bound (a small model's generation waits on Python and
      kernel launches, which a T4 does not do faster), this overstates the T4.
    - ``t4_low``: the larger of the measured seconds (a T4 is slower at
      everything a step does, on a host that is no faster) and the T4's roofline.

    The reward (on the CPU) is taken as measured, the optimizer step (memory-bound)
    scaled by the bandwidths. Returns ``phases`` ({phase: the figures above, with
    ``measured``, ``bound_here`` and ``t4_bound``}), ``other`` (reward and optimizer
    on the T4), ``step_scaled`` and ``step_low``.
    """
    if mode not in ("full", "lora"):
        raise ValueError(f"mode must be 'full' or 'lora', got {mode!r}")
    entry = measured_mode(record, GRPOConfig(use_peft=mode == "lora"))
    arch, shapes = record["qwen_step"]["model"]["architecture"], record["qwen_step"]["shapes"]
    stages = {name: stage["seconds"] for name, stage in stage_names(entry["step"])["stages"].items()}
    here_flops, here_bandwidth = published_peaks(record["device"]["name"])
    shape = dict(
        num_params=record["qwen_step"]["model"]["parameters"], vocab_size=arch["vocab_size"],
        hidden_size=arch["hidden_size"], tied_embeddings=arch["tie_word_embeddings"], prompts=shapes["prompts"],
        group_size=shapes["group_size"], prompt_tokens=shapes["prompt_tokens"],
        completion_tokens=round(entry["step"]["completion_tokens_mean"]), gradient_checkpointing=True,
        lora=mode == "lora",
    )
    here = estimate_step_seconds(**shape, peak_flops=here_flops, bandwidth=here_bandwidth)
    t4 = estimate_step_seconds(**shape)
    measured = {"generation": stages["sample"], "training": stages["forward"] + stages["backward"]}
    bounds = {"generation": "generate_seconds", "training": "train_seconds"}
    phases = {}
    for phase, seconds in measured.items():
        key = bounds[phase]
        phases[phase] = {
            "measured": seconds, "bound_here": here[key], "share_of_bound": here[key] / seconds,
            "t4_bound": t4[key], "t4_scaled": seconds * t4[key] / here[key], "t4_low": max(seconds, t4[key]),
        }
    other = stages["reward"] + stages["optimizer"] * here_bandwidth / T4_BANDWIDTH
    return {
        "phases": phases,
        "other": other,
        "step_scaled": other + sum(p["t4_scaled"] for p in phases.values()),
        "step_low": other + sum(p["t4_low"] for p in phases.values()),
    }


# ---------------------------------------------------------------------------
# Any configuration's session on a T4, from the same record
# ---------------------------------------------------------------------------

#: How many times slower than the measuring machine's the T4 session's host does the per-token work no FLOP
#: or byte count sees (Python's loop around each generated token, kernel launches): an ASSUMPTION, for the
#: high end of :func:`t4_run_estimate` (the low end takes 1: no slower).
HOST_SLOWDOWN = 2.0
#: How many times longer than on the measuring machine compiling a static cache's decoding step takes on Colab's
#: host (two virtual CPUs for inductor's compile workers): an ASSUMPTION, for the high end (the low end takes 1).
COMPILE_SLOWDOWN = 4.0


def lora_trainable_params(architecture: dict, rank: int) -> int:
    """LoRA's trained parameters on every linear layer of a Qwen2-style decoder: ``r * (in + out)`` per layer.

    Seven linear layers per block (``q, k, v, o`` and the MLP's ``gate, up,
    down``); PEFT's ``"all-linear"`` leaves out the output layer.
    """
    check_int(None, "rank", rank, 1)
    h, inter = architecture["hidden_size"], architecture["intermediate_size"]
    kv = architecture["num_key_value_heads"] * (h // architecture["num_attention_heads"])
    per_block = (h + h) + (h + kv) + (h + kv) + (h + h) + 2 * (h + inter) + (inter + h)
    return rank * per_block * architecture["num_hidden_layers"]


def t4_run_estimate(record: dict, config: GRPOConfig, *, prompt_tokens: int | None = None,
                    sampler: str | None = None) -> dict:
    """An ESTIMATE of ``config``'s step and of one evaluation batch on a T4, from the record's measured step.

    The record (``make gpu-proof``) measured a step of each mode, full fine-tuning
    and LoRA, at its own shapes on another GPU, and (since issue 43) each sampler
    on its own. The estimate reads the mode ``config`` trains (:func:`measured_mode`)
    and the sampler it generates with on a GPU (:func:`gpu_sampler`, or ``sampler``,
    a name of :data:`SAMPLER_LABELS`), and refuses (:class:`MissingMeasurement`)
    when the record lacks either. Each phase is carried over to ``config``'s
    shapes (prompts, group size, token budget, micro-batches, LoRA or not) and
    to a T4 with :func:`estimate_step_seconds` and one more piece each:

    - **generation** is split into the time its roofline explains and the rest:
      ``overhead_per_token = (measured - its bound there) / tokens``, the
      per-token work of Python and kernel launches that no FLOP count sees and
      that does not grow with the rows. A T4's generation of ``C`` tokens is
      ``C * overhead_per_token + the T4's bound`` at the low end, and
      ``C * overhead_per_token * HOST_SLOWDOWN + the T4's bound / share`` at the
      high end, where ``share`` is the share of its bound the measured training
      reached (arithmetic no more efficient than the measured). A float16
      sampler's bound reads 2 bytes a weight. The evaluation batch uses the
      record's evaluation measurement of the sampler where it has one.
    - **training** (arithmetic): the T4's bound at the low end (and no less than
      the measured phase carried to the new shapes on the measuring GPU), the
      bound over ``share`` at the high end.
    - the reward, scaled by the tokens generated, and the optimizer step, by
      the trainable weights and the two GPUs' bandwidths.
    - a static sampler's **compile**, once per new shape: the measured seconds at
      the low end, ``COMPILE_SLOWDOWN`` times them at the high end.

    Every completion is taken to run to the budget (the worst case; greedy
    answers that end sooner finish sooner when a whole batch has ended).

    Returns ``step`` (low, high), ``generation`` and ``training`` (low, high),
    ``other``, ``eval_batch`` (low, high: one evaluation batch of
    ``config.eval_batch_size`` problems, greedy), ``compile`` (low, high: seconds
    per compiled shape, 0 without a static cache), ``sampler`` (its name),
    ``source``, ``overhead_per_token``, ``share`` and ``trainable``.
    """
    entry = measured_mode(record, config)
    gen_source = _generation_source(record, config, sampler)
    try:
        eval_source = _generation_source(record, config, gen_source["name"], prefix="eval_")
    except MissingMeasurement:
        eval_source = gen_source  # no evaluation batch measured: the same per-token time at another row count
    arch, shapes = record["qwen_step"]["model"]["architecture"], record["qwen_step"]["shapes"]
    n_params = record["qwen_step"]["model"]["parameters"]
    stages = {name: stage["seconds"] for name, stage in stage_names(entry["step"])["stages"].items()}
    here_flops, here_bw = published_peaks(record["device"]["name"])
    prompt_tokens = shapes["prompt_tokens"] if prompt_tokens is None else prompt_tokens
    model = dict(num_params=n_params, vocab_size=arch["vocab_size"], hidden_size=arch["hidden_size"],
                 tied_embeddings=arch["tie_word_embeddings"], gradient_checkpointing=True)
    measured_c = round(entry["step"]["completion_tokens_mean"])
    measured = dict(prompts=shapes["prompts"], group_size=shapes["group_size"], prompt_tokens=shapes["prompt_tokens"],
                    completion_tokens=measured_c, lora=config.use_peft)
    minibatches = config.batch_completions // (config.minibatch_size or config.batch_completions)
    wanted = dict(prompts=config.prompts_per_step, group_size=config.group_size, prompt_tokens=prompt_tokens,
                  completion_tokens=config.max_new_tokens, num_iterations=config.num_iterations,
                  minibatches=minibatches, reference_model=config.beta > 0, lora=config.use_peft)
    here0 = estimate_step_seconds(**model, **measured, peak_flops=here_flops, bandwidth=here_bw)
    train0 = stages["forward"] + stages["backward"]
    share = here0["train_seconds"] / train0

    def overhead(source: dict) -> float:
        bound = estimate_step_seconds(**model, prompts=source["prompts"], group_size=source["group_size"],
                                      prompt_tokens=shapes["prompt_tokens"], completion_tokens=source["tokens"],
                                      weight_bytes=source["weight_bytes"], peak_flops=here_flops,
                                      bandwidth=here_bw)["generate_seconds"]
        return max(0.0, source["seconds"] - bound) / source["tokens"]

    def generation(prompts: int, group_size: int, source: dict) -> tuple[float, float]:
        bound = estimate_step_seconds(**model, prompts=prompts, group_size=group_size, prompt_tokens=prompt_tokens,
                                      completion_tokens=config.max_new_tokens,
                                      weight_bytes=source["weight_bytes"])["generate_seconds"]
        tokens, per_token = config.max_new_tokens, overhead(source)
        return tokens * per_token + bound, tokens * per_token * HOST_SLOWDOWN + bound / share

    t4_train = estimate_step_seconds(**model, **wanted)["train_seconds"]
    here_train = estimate_step_seconds(**model, **wanted, peak_flops=here_flops, bandwidth=here_bw)["train_seconds"]
    training = (max(t4_train, train0 * here_train / here0["train_seconds"]), t4_train / share)
    trainable = lora_trainable_params(arch, config.lora_r) if config.use_peft else n_params
    tokens_ratio = (config.batch_completions * config.max_new_tokens) / (
        shapes["prompts"] * shapes["group_size"] * measured_c)
    other = (stages["reward"] * tokens_ratio
             + stages["optimizer"] * (trainable / n_params) * here_bw / T4_BANDWIDTH)
    gen = generation(config.prompts_per_step, config.group_size, gen_source)
    compile_seconds = gen_source["compile_seconds"]
    return {
        "generation": gen,
        "training": training,
        "other": other,
        "step": (gen[0] + training[0] + other, gen[1] + training[1] + other),
        "eval_batch": generation(config.eval_batch_size, 1, eval_source),
        "compile": (compile_seconds, compile_seconds * COMPILE_SLOWDOWN),
        "sampler": gen_source["name"],
        "source": gen_source["source"],
        "overhead_per_token": overhead(gen_source),
        "share": share,
        "trainable": trainable,
    }


#: Installing the package and downloading Qwen2.5-0.5B-Instruct (about 1 GB) and GSM8K: an assumption, in minutes.
SETUP_MINUTES = 5.0


def session_estimate(record: dict, config: GRPOConfig, steps: int, n_eval: int,
                     setup_minutes: float = SETUP_MINUTES, *, sampler: str | None = None) -> dict:
    """An ESTIMATE of chapter 9's GPU notebook on a T4, part by part, in minutes: ``(low, high)`` each.

    Training is ``steps`` times :func:`t4_run_estimate`'s ``step``; an
    evaluation generates greedily for ``n_eval`` problems,
    ``config.eval_batch_size`` at a time (its ``eval_batch``, once per batch);
    the probe of section 9.2 is one step's generation. Setup is an assumed
    ``setup_minutes`` for both ends. With a static cache each new shape is
    compiled once (its ``compile``): the probe's, the first evaluation's batch
    sizes (the full batch and a smaller last one), the training step's; the
    second evaluation reuses the first's. ``sampler``: as :func:`t4_run_estimate`'s.

    Returns ``parts`` ({part: (low, high)}: ``setup``, ``probe``, ``evaluation
    before``, ``training``, ``evaluation after``), ``total`` (low, high),
    ``compiles`` (how many shapes are compiled) and ``run``
    (:func:`t4_run_estimate`'s dict, in seconds).
    """
    check_int(None, "steps", steps, 1)
    check_int(None, "n_eval", n_eval, 1)
    run = t4_run_estimate(record, config, sampler=sampler)
    batches = -(-n_eval // config.eval_batch_size)
    eval_shapes = 1 + (batches > 1 and n_eval % config.eval_batch_size != 0)
    compile_low, compile_high = run["compile"]

    def minutes(low: float, high: float, compiles: int = 0) -> tuple[float, float]:
        return (low + compiles * compile_low) / 60, (high + compiles * compile_high) / 60

    evaluation = (batches * run["eval_batch"][0], batches * run["eval_batch"][1])
    parts = {
        "setup": (setup_minutes, setup_minutes),
        "probe": minutes(*run["generation"], compiles=1),
        "evaluation before": minutes(*evaluation, compiles=eval_shapes),
        "training": minutes(steps * run["step"][0], steps * run["step"][1], compiles=1),
        "evaluation after": minutes(*evaluation),
    }
    total = (sum(low for low, _ in parts.values()), sum(high for _, high in parts.values()))
    compiles = (2 + eval_shapes) if compile_high > 0 else 0
    return {"parts": parts, "total": total, "compiles": compiles, "run": run}


def t4_memory_estimate(record: dict, config: GRPOConfig, *, prompt_tokens: int | None = None,
                       sampler: str | None = None) -> dict:
    """An ESTIMATE of ``config``'s peak GPU memory on a T4, carried over from the record's step of its mode.

    The record measured a step of each mode (:func:`measured_mode`; it refuses a
    mode the record lacks). Its training peak is the model state (full
    fine-tuning: 16 bytes a weight, float32 weights, gradients and AdamW's two
    moments; LoRA: 4 bytes a frozen weight and 16 a trained one), the sampler's
    copy of the weights if it keeps one (it stays allocated between steps), plus the
    activations and logits of one micro-batch; its generation peak, the state kept
    between steps (full: 12 bytes a weight; LoRA: 4 a frozen and 12 a trained one),
    the sampler's copy of the weights if it keeps one (a merged float32 copy: 4
    bytes a weight, a float16 copy: 2) plus the KV cache and logits of its rows.
    Here the state and the copy are ``config``'s (its mode, and its sampler on a
    GPU: :func:`gpu_sampler`, or ``sampler``), and the rest is scaled by the
    tokens in flight: ``micro_batch_size * (prompt + budget)`` in training,
    ``eval_batch_size * (prompt + budget)`` for an evaluation batch (the larger of
    that and a step's generation). Reserved memory is the allocated times the
    record's own reserved-to-allocated ratio.

    Returns ``training`` and ``generation`` (estimated bytes allocated),
    ``peak_reserved`` (bytes), ``cap`` (the record's T4 cap) and ``fits``.
    """
    entry = measured_mode(record, config)
    step = entry["step"]
    shapes, n = record["qwen_step"]["shapes"], record["qwen_step"]["model"]["parameters"]
    arch = record["qwen_step"]["model"]["architecture"]
    prompt_tokens = shapes["prompt_tokens"] if prompt_tokens is None else prompt_tokens
    measured_c = round(step["completion_tokens_mean"])
    measured_tokens = shapes["prompt_tokens"] + measured_c
    trainable = lora_trainable_params(arch, config.lora_r) if config.use_peft else n
    measured_trainable = entry.get("trainable_parameters", trainable)
    lora = config.use_peft

    def state(t: int) -> int:  # training: weights, gradients, moments
        return (4 * n + 16 * t) if lora else 16 * n

    def kept(t: int) -> int:  # between steps: weights and moments
        return (4 * n + 12 * t) if lora else 12 * n

    def copy_bytes(name: str) -> int:  # the sampler's own copy of the weights
        return 2 * n if name.startswith("float16") else 4 * n if (lora and name.startswith("plain")) else 0

    wanted_sampler = gpu_sampler(config) if sampler is None else sampler
    measured_copy = copy_bytes(measured_sampler(record, config))
    # the sampler's copy lives on between steps, through the backward pass too (the H200 record at 5bd90c7:
    # the merged sampler's LoRA step peaked 4 bytes a weight above the eager one's, to 0.1%)
    activations0 = step["stages"]["backward"]["peak_allocated"] - state(measured_trainable) - measured_copy
    generation0 = step["stages"]["sample"]["peak_allocated"] - kept(measured_trainable) - measured_copy
    tokens = prompt_tokens + config.max_new_tokens
    micro = config.micro_batch_size or config.batch_completions
    training = (state(trainable) + copy_bytes(wanted_sampler)
                + activations0 * (micro * tokens) / (shapes["micro_batch_size"] * measured_tokens))
    rows = max(config.eval_batch_size, config.batch_completions)
    generation = (kept(trainable) + copy_bytes(wanted_sampler)
                  + generation0 * (rows * tokens) / (shapes["completions"] * measured_tokens))
    ratio = step["peak_reserved"] / step["peak_allocated"]
    peak = max(training, generation) * ratio
    cap = record["memory_cap"]["bytes"]
    return {"training": training, "generation": generation, "peak_reserved": peak, "cap": cap, "fits": peak <= cap}


def chapter9_estimate(record: dict, config: GRPOConfig, steps: int, n_eval: int) -> dict:
    """What chapter 9 prints about its GPU session, from whichever record the package ships.

    First the sampler ``config`` runs on a GPU (:func:`gpu_sampler`); a record that
    did not measure it (every record before issue 43: its fast samplers wait for a
    lent GPU) says so, and the estimate falls back to the sampler the record's step
    of ``config``'s mode was measured with (:func:`measured_sampler`; for LoRA before
    issue 43, the adapters unmerged with the dynamic cache, which the fast sampler is
    meant to beat), said so too. A record without ``config``'s mode, or a dry run,
    gives no estimate at all: it says why, and never borrows another mode's step.

    Returns ``session`` (:func:`session_estimate`'s dict, or None), ``sampler`` (the
    one it read, or None), ``fast`` (the estimate with ``config``'s own GPU sampler,
    or None when unmeasured), ``lines`` (sentences to print) and ``shown`` (what a
    run record keeps of it: ``minutes`` (low, high) or None, ``sampler``,
    ``gpu_record`` (the record's commit), ``steps`` and ``n_eval``).
    """
    wanted, lines = gpu_sampler(config), []

    def out(session: dict | None, sampler: str | None, fast: dict | None) -> dict:
        shown = {"minutes": None if session is None else [round(m, 1) for m in session["total"]],
                 "sampler": sampler, "gpu_record": record.get("package_commit"), "steps": steps, "n_eval": n_eval}
        return {"session": session, "sampler": sampler, "fast": fast, "lines": lines, "shown": shown}

    try:
        fast = session_estimate(record, config, steps, n_eval)
    except MissingMeasurement as error:
        fast = None
        lines.append(f"UNMEASURED: the sampler this run uses on a GPU, {wanted!r} ({SAMPLER_LABELS[wanted]}): "
                     f"{error}")
    if fast is not None:
        return out(fast, wanted, fast)
    try:
        sampler = measured_sampler(record, config)
        session = session_estimate(record, config, steps, n_eval, sampler=sampler)
    except MissingMeasurement as error:
        lines.append(f"NO ESTIMATE: {error}")
        return out(None, None, None)
    lines.append(f"The estimate below reads the sampler the record measured for this mode instead, {sampler!r} "
                 f"({SAMPLER_LABELS[sampler]}).")
    return out(session, sampler, None)
