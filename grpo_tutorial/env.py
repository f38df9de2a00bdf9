"""What a chapter prints first: versions, device and threads, so outputs can be compared.

There is no "are we in Colab?" helper here: the one cell that asks, each notebook's
install cell, runs before this package is installed, so it tests
``"google.colab" in sys.modules`` itself (``tests/test_notebooks_meta.py`` checks it).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping


def describe_environment(print_it: bool = True) -> dict[str, str]:
    """Collect (and print) the versions and the device a notebook runs on."""
    import torch
    import transformers

    import grpo_tutorial

    if torch.cuda.is_available():  # asks the driver; does not start CUDA
        device = f"cuda ({gpu_name()})"
    else:
        device = f"cpu ({os.cpu_count()} cores, torch threads={torch.get_num_threads()})"
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "grpo_tutorial": grpo_tutorial.__version__,
        "device": device,
        "offline": "yes" if os.environ.get("HF_HUB_OFFLINE") == "1" else "no",
    }
    if print_it:
        width = max(map(len, info))
        for key, value in info.items():
            print(f"{key:<{width}} : {value}")
    return info


def gpu_name(timeout: float = 10.0) -> str:
    """The first GPU's name, without starting CUDA when it has not started yet.

    ``torch.cuda.get_device_name`` starts CUDA, and PyTorch's CUDA allocator reads
    ``PYTORCH_CUDA_ALLOC_CONF`` only then: a notebook that prints its environment
    first must not start it before a later cell has set the variable (chapter 9
    sets it in its install cell, but a user may not). So before CUDA has started
    the name comes from ``nvidia-smi``, and when that cannot answer, the result
    says so.
    """
    import shutil
    import subprocess

    import torch

    if torch.cuda.is_initialized():
        return torch.cuda.get_device_name(0)
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=timeout, check=True).stdout.strip().splitlines()
        except (OSError, subprocess.SubprocessError):
            out = []
        if out and out[0].strip():
            return out[0].strip()
    return "name not read: nvidia-smi did not answer, and asking PyTorch would start CUDA"


def show_download_progress() -> None:
    """Progress bars for downloads from the Hugging Face hub, none for loading weights from disk.

    ``transformers.utils.logging.disable_progress_bar()`` switches off both kinds
    (it also calls ``huggingface_hub``'s switch), so a 1 GB model would download
    without a sign of life. Here transformers' own bars (loading a model's
    weights: noise in a book page) stay off, and the hub's download bars on.
    """
    from huggingface_hub.utils import enable_progress_bars
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    enable_progress_bars()


def glue(name: str, value, display: bool = False):
    """Record `value` under `name` for the book's ``{glue:text}`name:fmt``` role; return it.

    The book build (MyST-NB) replaces the role by the value, so a re-run that changes
    the number changes the sentence. Where MyST-NB is not installed (Colab) this does
    nothing, and the role shows raw there: prefer a printed, asserted output for
    sentences a Colab reader needs (CONTRIBUTING.md, "Numbers in prose").
    """
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        return value
    myst_glue(name, value, display=display)
    return value


def kernel_fingerprint(threads: int = 1) -> str:
    """A short hash of what this machine's floating-point kernels compute, run at ``threads``.

    Two machines give a run bit for bit only when every kernel the run uses rounds
    the same way there. A CPU's name or ``torch.backends.cpu.get_cpu_capability()``
    does not tell that: an Intel and an AMD CPU both say ``AVX512`` and their BLAS
    sums in another order, and ``MKL_ENABLE_INSTRUCTIONS`` or ``ONEDNN_MAX_CPU_ISA``
    change the bits while the capability stays the same. So this function asks the
    kernels themselves: it computes a fixed set of probes (matrix products of the
    shapes a tiny model uses, ``log_softmax`` and other vectorised math, the normal
    sampler that initialises weights, the oneDNN linear generation uses, attention
    over a cached prefix, one forward, backward and fused AdamW step of a tiny Qwen2
    on fixed tokens, then its batched generation and both scoring passes, with
    trainable and with frozen weights, as the reference model has) and
    hashes every bit of their outputs. The inputs are small integers divided by
    powers of two, exact in float32, so only the kernels can make two machines
    disagree.

    Records and golden runs store the fingerprint of the machine that made them;
    a test compares bit for bit only where the fingerprints are equal, and up to
    rounding (or statistically) elsewhere. Equal fingerprints are strong evidence,
    not proof, that a long run repeats: if one does not, the probe missed a kernel.
    The global RNG and the thread count are left as they were.

    >>> len(kernel_fingerprint())
    16
    """
    import hashlib

    import torch

    from ._checks import check_int

    check_int(None, "threads", threads, 1)
    digest = hashlib.sha256()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng(devices=[]):
            for tensor in _kernel_probes():
                digest.update(tensor.detach().contiguous().numpy().tobytes())
    finally:
        torch.set_num_threads(previous)
    return digest.hexdigest()[:16]


#: The environment variables that choose PyTorch's, MKL's and oneDNN's kernels on a CPU.
KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR")


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else ``platform.processor()``."""
    from pathlib import Path

    cpu = platform.processor() or "unknown"
    cpuinfo = Path("/proc/cpuinfo")  # Linux; elsewhere the platform's own name
    if cpuinfo.is_file():
        lines = cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines()
        cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), cpu)
    return cpu


def kernel_variables(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The kernel variables (:data:`KERNEL_VARIABLES`) set in ``env`` (default: this process's environment).

    They choose the kernels only when PyTorch, MKL and oneDNN first start in a process: a
    variable changed afterwards is still listed here but no longer obeyed, which is why a
    record stores the fingerprint, what the kernels computed, beside them.
    """
    env = os.environ if env is None else env
    return {name: env[name] for name in KERNEL_VARIABLES if name in env}


def describe_kernels(threads: int = 1, env: Mapping[str, str] | None = None) -> dict:
    """The kernel fingerprint at ``threads`` and, for a reader, what it was measured on.

    Records store this beside their numbers: ``fingerprint`` is what a test compares;
    the CPU's model name, PyTorch's capability, the torch version and the kernel
    variables that were set (in ``env``, default this process's environment:
    :func:`kernel_variables`) only help a person tell two machines apart.
    """
    import torch

    cpu = cpu_name()
    return {
        "fingerprint": kernel_fingerprint(threads),
        "threads": threads,
        "cpu": cpu,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "variables": kernel_variables(env),
    }


def _operator_probes(g, exact):
    """The first outputs :func:`_kernel_probes` yields: single operators (products, softmaxes, reductions, the
    samplers, oneDNN's linear) on ``exact(*shape)``'s tensors; every draw comes from the probes' one generator ``g``."""
    import torch
    import torch.nn.functional as F

    from .speedups import onednn_available

    a, b, bias = exact(37, 128), exact(128, 512), exact(512)
    yield a @ b  # a GEMM of the tiny model's MLP shape
    yield exact(1, 128) @ b  # one row: generation's matrix-vector products
    yield F.linear(a, b.T.contiguous(), bias)
    yield torch.bmm(exact(8, 11, 32), exact(8, 32, 11))  # attention's batched products
    logits = exact(64, 21) * 8
    yield torch.log_softmax(logits, dim=-1)
    yield torch.softmax(logits, dim=-1)
    yield torch.logsumexp(exact(4, 151_936), dim=-1)  # a long reduction over a real vocabulary
    x = exact(4096)
    yield torch.stack([x.exp(), x.tanh(), F.silu(x), x.sigmoid(), (x.abs() + 1).rsqrt()])
    yield torch.stack([x.sum(), x.square().mean(), (x[:4000] * x[96:]).sum()])  # vectorised reductions
    yield torch.randn(4099, generator=g)  # the vectorised normal sampler behind weight init
    yield torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=g).float()
    if onednn_available():
        packed = torch.ops.mkldnn._reorder_linear_weight(b.T.contiguous(), 8)
        yield torch.ops.mkldnn._linear_pointwise(exact(8, 128), packed, bias, "none", [], "")


def _kernel_probes():
    """The outputs :func:`kernel_fingerprint` hashes, one tensor at a time: :func:`_operator_probes`, then a tiny
    model's weights, forward, backward and AdamW step, attention over a cached prefix, and the package's own
    sampling and scoring."""
    import copy

    import torch
    import torch.nn.functional as F

    from .config import GRPOConfig
    from .logprobs import completion_logprobs
    from .models import build_tiny_policy
    from .rollout import generate_rollouts, sampling_kwargs

    g = torch.Generator().manual_seed(1234)

    def exact(*shape: int) -> torch.Tensor:  # small integers / 256: exact in float32
        return torch.randint(-512, 512, shape, generator=g).float() / 256

    yield from _operator_probes(g, exact)
    model, tokenizer = build_tiny_policy(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=256, seed=0)
    yield torch.cat([p.detach().flatten() for p in model.parameters()])
    model.train()
    ids = torch.randint(3, model.config.vocab_size, (4, 12), generator=g)
    logits = model(input_ids=ids).logits
    loss = -torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).mean()
    loss.backward()
    yield logits
    yield torch.cat([p.grad.flatten() for p in model.parameters()])
    torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True).step()
    yield torch.cat([p.detach().flatten() for p in model.parameters()])
    # attention over a cached prefix (queries shorter than keys, a padding mask): what the
    # KV cache and the shared-prompt scoring pass run, and what the square case above does not
    q, k, v = exact(2, 4, 3, 16), exact(2, 4, 11, 16), exact(2, 4, 11, 16)
    keep = torch.ones(2, 1, 3, 11, dtype=torch.bool)
    keep[0, ..., :2] = False  # a left-padded row
    yield F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    # the package's own sampling and scoring: a batched generate with its KV cache, then the
    # full and the shared-prompt scoring passes of the sampled batch
    model.eval()
    sampling = sampling_kwargs(GRPOConfig(group_size=2, max_new_tokens=6), generator_seed=7)  # as a run samples
    rollout = generate_rollouts(model, tokenizer, ["4+9=", "12+7=", "3+3="], **sampling)
    yield rollout.completion_ids.float()
    width = rollout.completion_ids.shape[1]
    frozen = copy.deepcopy(model).requires_grad_(False)  # as the reference model is: another dispatch
    with torch.no_grad():
        for scored in (model, frozen):
            for share in (False, True):
                yield completion_logprobs(scored, rollout.input_ids, rollout.attention_mask, width, share_prompts=share)
