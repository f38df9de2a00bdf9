"""LoRA through PEFT: the adapters train, the base stays as it was and is the KL's reference.

With ``GRPOConfig(use_peft=True)`` the trainer hands the policy to
:func:`adapter_policies`, which wraps it with ``peft.get_peft_model`` (the
config's ``lora_*`` fields make the ``LoraConfig``, as TRL's ``get_peft_config``
makes it from the same names) and returns the step's
:class:`~grpo_tutorial.step.Policies` for it, :class:`AdapterPolicies`:

- the policy is the PEFT model: every linear layer it targets computes
  ``W x + (alpha / r) B A x``, with ``W`` frozen and only ``A`` and ``B``
  trainable, so AdamW holds only them;
- the reference of the KL term is the same model with its adapters switched
  off (``with model.disable_adapter():``), so no second copy of the model is
  kept. PEFT starts ``B`` at zero, so at step 0 the adapters add exact zeros
  and the reference gives the untrained model's log-probs bit for bit;
- a model that already is a ``PeftModel`` is used as it is; its adapter may
  be trained already, so (as in TRL) its reference is the base with a frozen
  copy of that adapter (:data:`REFERENCE_ADAPTER`), not the bare base;
- ``ref_sync_every``: the reference becomes the policy as it is now. Merging
  the adapters into the base would move the base itself (the "adapters off"
  reference, and the weights the adapters sit on), so instead the frozen
  reference adapter is overwritten with a copy of the trained one: the
  reference is the base plus the adapters as they were at the sync, at the
  cost of one more adapter (TRL refuses ``sync_ref_model`` with PEFT).

A checkpoint of such a run holds the adapters only (:class:`AdapterWeights`,
what the trainer gives the run machinery instead of the model), and the
base's fingerprint (:func:`base_fingerprint`), so that a resume or an
evaluation on another base is refused. :func:`export_merged` writes the
policy as one plain model, the adapters merged into the base
(``merge_and_unload``). ``peft`` is an optional dependency (``pip install
peft``, or the package's ``lora`` extra); nothing here imports it before it
is needed.
"""

from __future__ import annotations

import copy
import hashlib
import os
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from .config import GRPOConfig
from .seeding import ADAPTER_INIT, stream_seed
from .models import Policies

__all__ = [
    "AdapterPolicies",
    "AdapterWeights",
    "PEFT_INSTALL",
    "REFERENCE_ADAPTER",
    "adapter_of",
    "adapter_policies",
    "base_fingerprint",
    "check_checkpoint_fits",
    "checkpoint_meta",
    "checkpoint_weights",
    "export_merged",
    "is_peft_model",
    "lora_config",
    "merged_model",
    "require_peft",
    "wrap_with_adapters",
]

#: How to get PEFT.
PEFT_INSTALL = "pip install peft (or the package's lora extra: pip install -e '.[lora]')"
#: The frozen copy of the adapter that is the reference of a given PeftModel or of ``ref_sync_every`` (TRL's name).
REFERENCE_ADAPTER = "ref"
#: The checkpoint metadata key of :func:`base_fingerprint`.
BASE_KEY = "lora_base"


def require_peft() -> Any:
    """The ``peft`` module, or ``ModuleNotFoundError`` saying how to install it."""
    try:
        import peft
    except ImportError as err:
        raise ModuleNotFoundError(f"GRPOConfig.use_peft=True needs the peft package: {PEFT_INSTALL}") from err
    return peft


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` is a ``peft.PeftModel`` (False, without importing PEFT, when it was never imported)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def lora_config(config: GRPOConfig) -> Any:
    """The ``peft.LoraConfig`` of ``config``'s ``lora_*`` fields, as TRL's ``get_peft_config`` makes it."""
    peft = require_peft()
    return peft.LoraConfig(
        task_type="CAUSAL_LM", r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
        target_modules=config.lora_target_modules, bias="none",
    )


@contextmanager
def _seeded_init(seed: int) -> Iterator[None]:
    """PEFT draws the A matrices from the global CPU generator: seed it from the run, and put it back after.

    A run's randomness comes from named streams (:mod:`grpo_tutorial.seeding`), and
    building a trainer leaves the global RNGs as they were.
    """
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        torch.random.default_generator.manual_seed(stream_seed(seed, ADAPTER_INIT, 0))
        # PEFT 0.21 reads transformers 5's deprecated is_gradient_checkpointing; not ours to act on
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def wrap_with_adapters(model: torch.nn.Module, config: GRPOConfig) -> Any:
    """``model`` with new LoRA adapters (``peft.get_peft_model``, in place), ``A`` drawn from the run's seed, ``B = 0``."""
    peft = require_peft()
    if getattr(model, "peft_config", None):
        raise ValueError(
            f"this {type(model).__name__} already carries LoRA adapters: PEFT added them in place, for an earlier "
            "GRPOTrainer, and a second set would be added beside them. Load the model again to start a new run, "
            "or pass that trainer's trainer.model (the PeftModel) to train the same adapters on"
        )
    with _seeded_init(config.seed):
        return peft.get_peft_model(model, lora_config(config))


def adapter_of(key: str) -> str | None:
    """The adapter a state-dict key belongs to (``...q_proj.lora_A.default.weight`` -> ``default``); None for the base."""
    parts = key.split(".")
    for part, following in zip(parts, parts[1:]):
        if part.startswith("lora_"):
            return following
    return None


class AdapterPolicies(Policies):
    """The step's policies for a PEFT model: the reference is the policy with its adapters switched off.

    ``reference_adapter`` (a frozen copy of the trained adapter) makes the
    reference the base with that copy switched on instead, entered for the
    length of the reference's scoring pass. ``with_reference`` False (beta = 0):
    no reference at all. :attr:`reference_model` stays None: there is no other model.
    """

    def __init__(self, policy: Any, *, with_reference: bool, reference_adapter: str | None = None) -> None:
        super().__init__(policy, None)
        self.adapter = policy.active_adapter  # the adapter that trains
        self.with_reference, self.reference_adapter = with_reference, reference_adapter

    @contextmanager
    def reference(self) -> Iterator[torch.nn.Module | None]:
        """The reference, for the length of a scoring pass: the base (adapters off), or the base and the frozen copy."""
        if not self.with_reference:
            yield None
        elif self.reference_adapter is None:
            with self.policy.disable_adapter():
                yield self.policy
        else:
            self.policy.set_adapter(self.reference_adapter, inference_mode=True)
            try:
                yield self.policy
            finally:
                self.policy.set_adapter(self.adapter)  # trainable again, the copy frozen

    def sync_reference(self) -> None:
        """``ref_sync_every``: the reference adapter becomes a copy of the trained one (the base is never touched)."""
        if self.reference_adapter is None:  # not reached: adapter_policies adds the copy whenever a sync can come
            raise RuntimeError("sync_reference needs a reference adapter (adapter_policies adds one with ref_sync_every)")
        _copy_adapter(self.policy, self.adapter, self.reference_adapter)


def _copy_adapter(model: Any, source: str, target: str) -> None:
    """Overwrite adapter ``target``'s tensors with adapter ``source``'s."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, param in params.items():
            if adapter_of(name) == source:
                params[name.replace(f".{source}.", f".{target}.")].copy_(param)


def _add_reference_adapter(model: Any, seed: int) -> str:
    """A frozen copy of ``model``'s active adapter, named :data:`REFERENCE_ADAPTER`; the active adapter stays active."""
    active = model.active_adapter
    with _seeded_init(seed):
        model.add_adapter(REFERENCE_ADAPTER, copy.deepcopy(model.peft_config[active]))
    model.set_adapter(active)  # the trained adapter stays the active, trainable one
    _copy_adapter(model, active, REFERENCE_ADAPTER)
    for name, param in model.named_parameters():
        if adapter_of(name) == REFERENCE_ADAPTER:
            param.requires_grad_(False)
    return REFERENCE_ADAPTER


def adapter_policies(model: torch.nn.Module, config: GRPOConfig, ref_model: Any = None) -> AdapterPolicies | None:
    """What :class:`~grpo_tutorial.trainer.GRPOTrainer` trains for ``config``: None (the whole model, the step's
    default policies) or, with ``use_peft``, the PEFT model and its reference (:class:`AdapterPolicies`).

    A plain model is wrapped (:func:`wrap_with_adapters`), in place; a ``PeftModel``
    is used as it is, with a frozen copy of its adapter as the reference. Refused:
    a ``PeftModel`` without ``use_peft``, a ``ref_model`` with it, and a PEFT model
    with several adapters or a prompt-learning method.
    """
    given = is_peft_model(model)
    if not config.use_peft:
        if given:
            raise ValueError("the model is a peft.PeftModel, but GRPOConfig.use_peft is False: set use_peft=True "
                             "to train its adapters (its own adapter settings apply, not the lora_* fields)")
        return None
    require_peft()
    if ref_model is not None:
        raise ValueError("ref_model must be None with GRPOConfig.use_peft=True: the reference is the policy's base "
                         "with the adapters switched off, so no second model is needed")
    if given:
        names = list(model.peft_config)
        if len(names) != 1 or model.peft_config[names[0]].is_prompt_learning:
            raise ValueError(f"a PeftModel given to the trainer must hold one adapter of a LoRA-like method, got "
                             f"{ {name: type(c).__name__ for name, c in model.peft_config.items()} }")
    policy = model if given else wrap_with_adapters(model, config)
    reference_adapter = None
    if config.beta > 0 and (given or config.ref_sync_every):  # a copy only where the bare base would not do
        reference_adapter = _add_reference_adapter(policy, config.seed)
    return AdapterPolicies(policy, with_reference=config.beta > 0, reference_adapter=reference_adapter)


# ---------------------------------------------------------------------------
# Checkpoints and export
# ---------------------------------------------------------------------------


class AdapterWeights:
    """A PEFT model's adapters as a checkpoint holds them: ``state_dict()`` has the adapter tensors only.

    Every adapter the model has (the reference copy included), never the base.
    The trainer gives it to the run machinery in place of the model.
    :meth:`load_state_dict` needs every adapter tensor of the model and ignores
    those of adapters the model does not have (an evaluation needs no reference
    copy); a whole model's weights, or another shape of adapters, are refused.
    """

    def __init__(self, model: Any) -> None:
        self.model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {key: value for key, value in self.model.state_dict().items() if adapter_of(key) is not None}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        mine = self.state_dict()
        base = [key for key in state if adapter_of(key) is None]
        missing = sorted(set(mine) - set(state))
        if base or missing:
            why = (f"it holds {len(base)} base weights (a full fine-tuning checkpoint?)" if base
                   else f"it lacks {len(missing)} of this model's adapter tensors, e.g. {missing[0]!r}")
            raise ValueError(f"the checkpoint does not hold this PEFT model's adapters: {why}; resume or evaluate "
                             "it with the lora_* settings it was saved with")
        for key in mine:
            if tuple(state[key].shape) != tuple(mine[key].shape):
                raise ValueError(f"the checkpoint's {key!r} has shape {tuple(state[key].shape)}, this model's "
                                 f"{tuple(mine[key].shape)}: another lora_r or target modules")
        self.model.load_state_dict({key: state[key] for key in mine}, strict=False)


def checkpoint_weights(model: Any) -> Any:
    """What a checkpoint stores of ``model``: its adapters (:class:`AdapterWeights`) for a PEFT model, else the model."""
    return AdapterWeights(model) if is_peft_model(model) else model


def base_fingerprint(model: Any) -> str:
    """A short hash of the base weights under a PEFT model's adapters.

    Each base tensor's name, shape, dtype and first and last 4096 values: the
    base never trains, so the hash stays the same through a run, and another
    base (another warm start, seed, checkpoint or precision) gives another hash.
    """
    digest = hashlib.blake2b(digest_size=8)
    for key, tensor in model.state_dict().items():
        if adapter_of(key) is not None:
            continue
        flat = tensor.detach().reshape(-1)
        sample = torch.cat([flat[:4096], flat[-4096:]]) if flat.numel() > 8192 else flat
        digest.update(f"{key}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(sample.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def checkpoint_meta(model: Any) -> dict[str, str]:
    """What a checkpoint's metadata adds for ``model``: the base's fingerprint for a PEFT model, nothing otherwise."""
    return {BASE_KEY: base_fingerprint(model)} if is_peft_model(model) else {}


def check_checkpoint_fits(meta: dict, model: Any) -> None:
    """Refuse a checkpoint (its metadata ``meta``) that ``model`` cannot take: adapters for a whole model or the
    reverse, or adapters trained on another base."""
    saved = bool(meta.get("config", {}).get("use_peft", False))
    if saved != is_peft_model(model):
        raise ValueError(
            "the checkpoint holds LoRA adapters but the model has none: use the run's config (use_peft=True)"
            if saved else "the checkpoint holds a whole model but this model trains LoRA adapters: use the run's "
            "config (use_peft=False)"
        )
    mine = base_fingerprint(model) if saved else None
    if saved and meta.get(BASE_KEY, mine) != mine:
        raise ValueError(
            f"the checkpoint's adapters were trained on another base model (fingerprint {meta[BASE_KEY]}, this "
            f"model's {mine}): load the base the run started from (after its warm start, in the same dtype) before "
            "resuming or evaluating"
        )


def merged_model(model: Any, *, copy_first: bool = True) -> torch.nn.Module:
    """``model``'s adapters merged into its base (``merge_and_unload``): one plain transformers model.

    ``copy_first`` (default) merges a deep copy, so ``model`` trains on unchanged
    (it costs a second copy of the model for a moment); False merges ``model``
    itself, which is then spent. A model without adapters is returned as it is.
    """
    if not is_peft_model(model):
        return model
    target = copy.deepcopy(model) if copy_first else model
    return target.merge_and_unload()


def export_merged(model: Any, path: str | os.PathLike, tokenizer: Any = None, *, copy_first: bool = True) -> Path:
    """Save ``model`` with its adapters merged into the base (:func:`merged_model`) to the folder ``path``.

    ``save_pretrained``, and the tokenizer's when given, so that
    :func:`~grpo_tutorial.pretrained.load_policy` (and any transformers code)
    loads the result as an ordinary model. Returns ``path``.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    merged_model(model, copy_first=copy_first).save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path
