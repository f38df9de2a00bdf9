"""The tiny policy built in code, the choice of device and precision, and the frozen reference.

* :func:`build_tiny_policy`: a ``Qwen2ForCausalLM`` (the class behind Qwen2.5)
  with about 0.8M parameters and a character-level tokenizer
  (:func:`build_char_tokenizer`). Built from a seed in a fraction of a second,
  no download; ``load_policy("tiny")`` returns it.
* :func:`pick_device_and_dtype`: where a policy runs and in what precision
  (float32 unless asked: the trainer's weights; :func:`generation_dtype` for a
  model that only generates; :func:`native_bf16_supported`,
  :func:`use_expandable_segments` for a GPU).
* :func:`frozen_reference` and :func:`disable_dropout`: the reference policy of
  the KL penalty.
* :func:`prepare_for_generation`: left padding, a pad token and the pad/EOS ids
  in the generation config, which every policy gets.

Loading a pretrained policy (SmolLM2 offline, any hub model online, a saved
folder) is :mod:`grpo_tutorial.pretrained`'s job; its ``load_policy`` is the one
entry point for every kind of policy, the tiny one included.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from ._checks import check_int

__all__ = [
    "Policies",
    "TINY_CHARS",
    "TINY_TOOL_CHARS",
    "TINY_SPECIALS",
    "build_char_tokenizer",
    "build_tiny_policy",
    "disable_dropout",
    "frozen_reference",
    "generation_dtype",
    "native_bf16_supported",
    "pick_device_and_dtype",
    "prepare_for_generation",
    "use_expandable_segments",
]

#: The characters of the tiny tokenizer's default vocabulary: digits, the
#: arithmetic symbols ``+ - * = ( )`` and the space (17 characters).
TINY_CHARS = "0123456789+-*=() "
#: Chapter 16's vocabulary: :data:`TINY_CHARS` and the calculator's call syntax ``<< >>`` and its error ``?``
#: (:class:`~grpo_tutorial.tools.InlineCalls`), appended so every earlier character keeps its id.
#: The other chapters build their models with :data:`TINY_CHARS`, so their records do not move.
TINY_TOOL_CHARS = TINY_CHARS + "<>?"
#: The tiny tokenizer's special tokens, with ids 0, 1, 2, 3 in this order.
TINY_SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")

_DTYPE_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


# ---------------------------------------------------------------------------
# Device and dtype
# ---------------------------------------------------------------------------


def _as_device(device: str | torch.device) -> torch.device:
    """Parse ``device`` into a ``torch.device`` and check that it exists here."""
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a string such as 'cpu' or 'cuda', or a torch.device; got {type(device).__name__}: {device!r}")
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device={device!r} is not a valid torch device (expected e.g. 'cpu', 'cuda', 'cuda:0'): {err}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was requested but CUDA is not available on this machine; use device='cpu' or device=None")
    return dev


def _as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Parse ``dtype`` (a torch floating dtype or a name such as ``"bf16"``)."""
    if isinstance(dtype, str):
        key = dtype.lower().removeprefix("torch.")
        if key not in _DTYPE_NAMES:
            raise ValueError(f"dtype={dtype!r} is not a known name; expected one of {sorted(_DTYPE_NAMES)} or a torch dtype")
        return _DTYPE_NAMES[key]
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"dtype={dtype} is not supported for a policy; expected torch.float32, torch.bfloat16 or torch.float16")
        return dtype
    raise TypeError(f"dtype must be a torch dtype or a string such as 'float32' or 'bf16'; got {type(dtype).__name__}: {dtype!r}")


def pick_device_and_dtype(
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
) -> tuple[torch.device, torch.dtype]:
    """Choose where a policy runs and in what precision.

    - ``device=None``: ``"cuda"`` when a GPU is available, else ``"cpu"``.
    - ``dtype=None``: float32, on every device. The trainer's AdamW updates the
      weights the model holds (there is no float32 master copy), and an update of
      size ``lr`` is mostly rounded away in 16-bit weights (chapter 9, section 9.5;
      :func:`grpo_tutorial.optim.trainable_parameters` warns about it). A model that
      only generates may use :func:`generation_dtype`, the fast 16-bit format of
      the GPU.

    Explicit values win. ``dtype`` may be a name: ``"float32"``/``"fp32"``,
    ``"bfloat16"``/``"bf16"``, ``"float16"``/``"fp16"``/``"half"``.

    >>> pick_device_and_dtype("cpu")
    (device(type='cpu'), torch.float32)
    """
    if device is None:
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        dev = _as_device(device)
    return dev, torch.float32 if dtype is None else _as_dtype(dtype)


def generation_dtype(device: str | torch.device | None = None) -> torch.dtype:
    """The precision to *generate* in on ``device`` (default: as :func:`pick_device_and_dtype`), never to train in.

    bfloat16 on a GPU that computes in it natively (Ampere and newer), float16 on
    an older GPU (such as Colab's free T4, which would only emulate bfloat16;
    :func:`native_bf16_supported`), float32 on the CPU. Pass it as
    ``load_policy(name, dtype=generation_dtype())`` for a model that is only
    sampled or evaluated; a model to train stays in float32, the default.
    float16's range ends at 65504, and some models' activations overflow it to
    inf or NaN: if the logits come out NaN, generate in float32.

    >>> generation_dtype("cpu")
    torch.float32
    """
    dev = pick_device_and_dtype(device)[0]
    if dev.type == "cuda":
        return torch.bfloat16 if native_bf16_supported() else torch.float16
    return torch.float32


def native_bf16_supported() -> bool:
    """Whether the GPU computes in bfloat16 in hardware (Ampere and newer), not by emulation.

    ``torch.cuda.is_bf16_supported()`` also counts emulation, and says True on
    Colab's T4 (Turing), where bfloat16 matrix products are emulated and slow.
    Where the installed torch has the ``including_emulation`` argument (2.3 and
    newer) it is set to False; older versions did not count emulation.
    """
    check = torch.cuda.is_bf16_supported
    try:
        return bool(check(including_emulation=False))
    except TypeError:  # an older torch without the argument
        return bool(check())


def use_expandable_segments() -> str:
    """Ask PyTorch's CUDA allocator for expandable segments (less fragmentation); returns what was done.

    A step allocates and frees many tensors the size of a micro-batch's logits
    (over a GiB for Qwen2.5's vocabulary); with fixed-size segments the freed
    blocks can be too fragmented for the next one, and a T4 runs out of memory
    with gigabytes "reserved but unallocated". ``PYTORCH_CUDA_ALLOC_CONF=
    expandable_segments:True`` lets segments grow instead. The variable is read
    when CUDA starts, so before that it is set (unless the user set it); once
    CUDA runs, the allocator's runtime setting is used where torch has it.
    """
    key, value = "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"
    current = os.environ.get(key, "")
    if "expandable_segments" in current:
        return f"{key}={current} (already set)"
    if not torch.cuda.is_initialized():
        os.environ[key] = f"{current},{value}" if current else value
        return f"{key}={os.environ[key]}"
    setter = getattr(getattr(torch.cuda, "memory", None), "_set_allocator_settings", None)
    if setter is None:
        return f"CUDA already started; set {key}={value} before the first CUDA call"
    setter(value)
    return f"{value} (set at run time: CUDA had already started)"


# ---------------------------------------------------------------------------
# The tiny policy
# ---------------------------------------------------------------------------


def _check_chars(vocab: str | Sequence[str]) -> list[str]:
    """Validate the tiny vocabulary: distinct single characters, none of them special."""
    if isinstance(vocab, str):
        chars = list(vocab)
    elif isinstance(vocab, Sequence) and all(isinstance(c, str) for c in vocab):
        chars = list(vocab)
    else:
        raise TypeError(f"vocab must be a string of characters or a list of one-character strings; got {type(vocab).__name__}: {vocab!r}")
    if not chars:
        raise ValueError("vocab must contain at least one character; got an empty vocabulary")
    bad = [c for c in chars if len(c) != 1]
    if bad:
        raise ValueError(f"vocab entries must be single characters; got {bad!r}")
    dupes = sorted({c for c in chars if chars.count(c) > 1})
    if dupes:
        raise ValueError(f"vocab has repeated characters {dupes!r}; each character may appear once")
    return chars


def build_char_tokenizer(vocab: str | Sequence[str] | None = None, model_max_length: int = 64):
    """A character-level tokenizer made with the ``tokenizers`` library.

    Ids: ``<pad>``=0, ``<bos>``=1, ``<eos>``=2, ``<unk>``=3, then one id per
    character of ``vocab`` in order (default :data:`TINY_CHARS`, 21 ids in all).

    Behaviour, like a real LLM tokenizer:

    - every character becomes exactly one token, and ``<bos>`` is prepended
      (``tokenizer("12+34=")`` gives 7 ids; pass ``add_special_tokens=False`` for 6);
    - the literal text ``"<eos>"`` (or ``"<pad>"``, ``"<bos>"``) is read as that
      special token, which is how a training target ends with EOS;
    - a character outside the vocabulary becomes ``<unk>`` (one id per character,
      never dropped), so ``tokenizer.unk_token_id in ids`` reveals it. Note that
      ``decode(..., skip_special_tokens=True)`` hides ``<unk>`` like every special
      token; decode without skipping to see it;
    - padding is on the left; ``decode(ids, skip_special_tokens=True)`` gives the
      text back exactly, spaces included.

    Returns a ``transformers.PreTrainedTokenizerFast``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    chars = _check_chars(TINY_CHARS if vocab is None else vocab)
    check_int(None, "model_max_length", model_max_length, 1)
    pad, bos, eos, unk = TINY_SPECIALS
    token_to_id = {tok: i for i, tok in enumerate(list(TINY_SPECIALS) + chars)}

    backend = Tokenizer(models.WordLevel(token_to_id, unk_token=unk))
    # Split before every code point ("[\s\S]" also matches newlines), keeping each one.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()  # join the characters back with no separator
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A",
        pair=f"{bos} $A $B",
        special_tokens=[(bos, token_to_id[bos])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=pad,
        bos_token=bos,
        eos_token=eos,
        unk_token=unk,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )


def build_tiny_policy(
    hidden_size: int = 128,
    num_layers: int = 3,
    num_heads: int = 4,
    vocab: str | Sequence[str] | None = None,
    intermediate_size: int = 512,
    max_position_embeddings: int = 64,
    seed: int = 0,
    *,
    num_kv_heads: int | None = None,
    rope_theta: float = 10000.0,
):
    """A small ``Qwen2ForCausalLM`` with a character tokenizer, initialised from ``seed``.

    It is the same model class as Qwen2.5, just narrow and shallow. With the
    defaults (hidden 128, 3 layers, 4 heads, MLP 512, tied input/output embeddings,
    21-token vocabulary) it has 791,168 parameters. The same arguments give the
    same weights, and the caller's global torch RNG is left untouched.

    ``vocab`` is a string (or list) of single characters; ``None`` means
    :data:`TINY_CHARS`. See :func:`build_char_tokenizer` for the token ids.
    ``num_kv_heads`` < ``num_heads`` gives grouped-query attention, as in Qwen2.5.

    Returns ``(model, tokenizer)``, the model on the CPU in float32 and eval mode.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    for arg, value in [
        ("hidden_size", hidden_size),
        ("num_layers", num_layers),
        ("num_heads", num_heads),
        ("num_kv_heads", kv_heads),
        ("intermediate_size", intermediate_size),
        ("max_position_embeddings", max_position_embeddings),
    ]:
        check_int(None, arg, value, 1)
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size={hidden_size} must be divisible by num_heads={num_heads}")
    if (hidden_size // num_heads) % 2:
        raise ValueError(f"the head size hidden_size/num_heads={hidden_size // num_heads} must be even (rotary embeddings rotate pairs)")
    if num_heads % kv_heads:
        raise ValueError(f"num_heads={num_heads} must be divisible by num_kv_heads={kv_heads}")
    check_int(None, "seed", seed)

    tokenizer = build_char_tokenizer(vocab, model_max_length=max_position_embeddings)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_position_embeddings,
        rope_theta=rope_theta,
        tie_word_embeddings=True,
        use_sliding_window=False,
        attention_dropout=0.0,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):  # seed the init without touching the caller's RNG
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.eval()
    prepare_for_generation(model, tokenizer)
    return model, tokenizer


# ---------------------------------------------------------------------------
# Shared finishing touches
# ---------------------------------------------------------------------------


def prepare_for_generation(model, tokenizer) -> None:
    """Left padding, a pad token, and pad/EOS ids in the model's generation config.

    Every policy gets this: the tiny one when it is built, a loaded one in
    :func:`grpo_tutorial.pretrained.load_policy`.
    """
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has neither a pad nor an EOS token; batched generation needs one")
        tokenizer.pad_token = tokenizer.eos_token  # the usual choice; the attention mask hides it
    model.config.pad_token_id = tokenizer.pad_token_id
    gen = model.generation_config
    gen.pad_token_id = tokenizer.pad_token_id
    if gen.eos_token_id is None:
        gen.eos_token_id = tokenizer.eos_token_id
    if gen.bos_token_id is None and tokenizer.bos_token_id is not None:
        gen.bos_token_id = tokenizer.bos_token_id


# ---------------------------------------------------------------------------
# The frozen reference
# ---------------------------------------------------------------------------


def disable_dropout(model: torch.nn.Module) -> None:
    """Set every dropout probability in ``model`` to 0: ``nn.Dropout`` modules and
    the ``attention_dropout`` rates that attention layers read from their config."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
    config = getattr(model, "config", None)
    for name in ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "attn_pdrop", "embd_pdrop"):
        if isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)


def frozen_reference(
    policy: torch.nn.Module, reference: torch.nn.Module | None = None, *, without_dropout: bool = True
) -> torch.nn.Module:
    """The reference policy of the KL penalty: ``reference``, or a deep copy of ``policy``.

    Frozen (no gradients), in eval mode, and with ``without_dropout`` its
    dropout off (:func:`disable_dropout`). The copy is taken as ``policy`` is now.
    """
    reference = copy.deepcopy(policy) if reference is None else reference
    reference.eval()
    reference.requires_grad_(False)
    if without_dropout:
        disable_dropout(reference)
    return reference


class Policies:
    """The policy being trained and the frozen reference its KL term compares it with (the step's extension point,
    :class:`~grpo_tutorial.step.GRPOStep`'s ``policies``).

    This default holds a separate model as the reference (None without a KL
    penalty); :class:`~grpo_tutorial.lora.AdapterPolicies` yields the policy with
    its LoRA adapters switched off instead, so that no second copy is kept.
    """

    def __init__(self, policy: torch.nn.Module, reference: torch.nn.Module | None = None) -> None:
        self.policy, self.reference_model = policy, reference

    @classmethod
    def default(cls, model: torch.nn.Module, ref_model: torch.nn.Module | None, config: Any) -> "Policies":
        """The step's default: the reference only with a KL penalty, ``ref_model`` or a frozen copy of ``model``."""
        if config.use_peft:  # LoRA's policies wrap the model first, as GRPOTrainer does
            raise ValueError("config.use_peft needs policies=lora.adapter_policies(model, config) (GRPOTrainer's)")
        ref = frozen_reference(model, ref_model, without_dropout=config.disable_dropout) if config.beta > 0 else None
        return cls(model, ref)

    @contextmanager
    def reference(self) -> Iterator[torch.nn.Module]:
        """The reference, for the length of a scoring pass."""
        yield self.reference_model

    def sync_reference(self) -> None:
        """``ref_sync_every``: the reference becomes a copy of the policy (nothing to do without one)."""
        if self.reference_model is not None:
            self.reference_model.load_state_dict(self.policy.state_dict())
