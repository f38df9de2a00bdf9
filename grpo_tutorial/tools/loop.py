"""Stage 1 with tools: rollouts that stop at a tool call, run the tool, and go on (TRL's ``tools=``).

A rollout with tools is several turns of one completion. The policy writes until
it calls a tool; the tool runs and its result is appended to the row; the policy
goes on from there; and so on, up to ``max_tool_calling_iterations`` rounds of
calls (TRL's name and meaning: None, no limit). Every round is ONE batched
``generate`` call over the rows still running, as in TRL's ``_tool_call_loop``.

The idea to get right is the **tool mask**. The tool's tokens were not sampled by
the policy: they have no probability under the sampler, so no ratio, and training
on them would teach the policy to *predict* the tool's answer instead of calling
it. :class:`~grpo_tutorial.rollout.Rollout` carries ``tool_mask`` (``[N, Tc]``,
0 on the tool's tokens, 1 elsewhere, as TRL builds it) and the step trains on
``completion_mask * tool_mask`` (:attr:`~grpo_tutorial.rollout.Rollout.loss_mask`):
the loss, the KL term and every normaliser count the policy's tokens only. The
policy still *reads* the tool's tokens (they are in the attention mask).

The normalisers are TRL's, over that mask (``tests/test_chat_tools.py`` runs TRL's own
``_compute_loss`` on TRL's own tool batch): ``grpo`` divides each completion by its
count of the policy's tokens; ``bnpo`` by the micro-batch's; ``dapo`` (and ``cispo``,
``vespo``) by ``num_items_in_batch``, the loss mask's sum over the update, which TRL
computes the same way. One normaliser still counts the tool: ``dr_grpo``'s constant,
``max_completion_length`` (our ``max_new_tokens``), is the budget of the whole
completion, the tool's tokens included, in TRL and here alike: the sum of the
policy's tokens is divided by a budget that the tool's tokens share. None differs
from TRL's.
Ours only: ``mask_tool_tokens=False``, chapter 16's control, trains on the tool's
tokens too.

Two ways to write a call (a *call syntax*):

* :class:`InlineCalls`, for models without a chat template (chapter 16's tiny
  model): GSM8K's calculator annotations. The model writes ``<<48/2=``, the row
  stops there, the tool writes ``24>>`` and the model goes on (``24<eos>``). The
  call sits in the middle of the completion, so only the tool's result is masked.
* :class:`ChatCalls`, for chat models whose template supports tools (TRL's route):
  the assistant's turn ends (EOS) with a tool call, which TRL's response parser
  reads; the tool's message, in the chat template's wrapper, is appended and masked,
  and the assistant writes its next turn (:mod:`~grpo_tutorial.tools.chat`: TRL's
  own parser and its own ``_get_tool_suffix_ids``). As in TRL, a turn cut off by
  the budget is parsed too: a whole call in it runs and counts, and its answer,
  which cannot fit, is rolled back. As in TRL, the prompt describes the tools: the
  chat template renders their schemas (``apply_chat_template(..., tools=...)``).

How each failure is handled. TRL's rules: a tool that raises, an unknown tool
name, or an unsupported call type gives a result ``{"error": ...}`` that the model
sees, and counts as a failure; a malformed call is left as plain text and ends the
turn; at the iteration limit the loop stops with the last call unanswered; a result
that would push the completion past its token budget is rolled back (the row ends
with its call unanswered). Our additions, where TRL has no rule: a call past its
time limit (``tool_time_limit``) gives an error result and counts as a failure
(:func:`~grpo_tutorial.tools.calculator.run_tool_call`), and so does every call after the
rollout's own deadline (``tool_rollout_time_limit``: all its calls together); a tool that
returns an error result of its own counts as a failure; a result is turned into text in
the call's own thread, within its time limit (:func:`~grpo_tutorial.tools.calculator.safe_text`:
a ``str()`` that raises, or a lone surrogate, becomes safe text); a result longer than the
completion's remaining budget could hold is rolled back before it is tokenized; a result
the tokenizer cannot write back as it is (characters outside the vocabulary, which would
vanish into ``<unk>``, or text that would become a special token such as ``<eos>``)
becomes an error result the model can read, and counts as a failure; a call that the
response parser cannot read (JSON nested past Python's recursion limit, say) is a
malformed call. Nothing a tool or the model does raises out of the loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from .._checks import check_int, check_time_limit
from ..rollout import Rollout, generate_from_ids, generate_rollouts, pad_token_id, stop_token_ids, uses_chat_template
from .calculator import run_tool_call, safe_text

__all__ = ["NO_TOOLS_FOR_A_FUNCTION", "ChatCalls", "InlineCalls", "ToolBox", "generate_tool_rollouts", "tool_box"]


@dataclass(frozen=True)
class InlineCalls:
    """A call written inside the completion: ``<<expression=``; the tool answers ``result>>``.

    This is how GSM8K's solutions annotate their arithmetic (``<<48/2=24>>``). The one
    tool takes the expression as its only argument; an error result is written as
    ``error`` (``"?>>"``), since a character model cannot spell the error message.
    """

    open: str = "<<"
    ask: str = "="
    close: str = ">>"
    error: str = "?"

    def stop_ids(self, tokenizer: Any) -> list[int]:
        """The token ids after which a row may be asking: those whose text ends with ``ask``."""
        vocab = tokenizer.get_vocab()
        return sorted(i for tok, i in vocab.items() if tokenizer.decode([i]).endswith(self.ask))

    def pending(self, text: str) -> str | None:
        """The expression of the call ``text`` ends with (``"12*34"`` for ``"...<<12*34="``), else None.

        ``text`` is the whole row, prompt included, so that a prompt may open the call."""
        start = text.rfind(self.open)
        if start < 0 or not text.endswith(self.ask):
            return None
        body = text[start + len(self.open): len(text) - len(self.ask)]
        return None if self.close in body or self.open in body else body

    def calls(self, tokenizer: Any, prefix_ids: list[int], turn_ids: list[int], ended: bool,
              tools: dict[str, Callable]) -> list[dict] | None:
        """The calls a stopped turn asks for (one at most), in TRL's form; None: the turn asked for none."""
        if ended:  # the model wrote its EOS: the completion is over
            return None
        expression = self.pending(tokenizer.decode(prefix_ids + turn_ids, skip_special_tokens=True))
        if expression is None:
            return None
        name = next(iter(tools))
        return [{"type": "function", "function": {"name": name, "arguments": {_argument(tools[name]): expression}}}]

    def suffix_ids(self, tokenizer: Any, results: list[tuple[str, Any]]) -> list[int]:
        """The tokens the tool writes: its result (or ``error``) and ``close``."""
        (_, result), = results
        text = self.error if isinstance(result, dict) and "error" in result else str(result)
        return tokenizer(text + self.close, add_special_tokens=False)["input_ids"]

    def check(self, tools: dict[str, Callable]) -> None:
        if len(tools) != 1:
            raise ValueError(f"InlineCalls writes calls to one tool (the calculator); got {len(tools)} tools: "
                             f"{sorted(tools)}. Use a chat model and ChatCalls for several tools")
        _argument(next(iter(tools.values())))  # one required argument, checked now, not at the first call


def _argument(fn: Callable) -> str:
    """The name of a one-argument tool's parameter (the calculator's ``expression``)."""
    import inspect

    name = getattr(fn, "__name__", type(fn).__name__)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as error:  # a builtin such as max has none Python can read
        raise ValueError(f"an inline tool takes one required argument, named in its signature; {name} has no "
                         f"signature Python can read ({error}): wrap it in a def") from error
    required = [p for p in signature.parameters.values() if p.default is p.empty
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    others = [p for p in signature.parameters.values() if p.default is p.empty and p not in required
              and p.kind is p.POSITIONAL_ONLY]
    if len(required) != 1 or others:
        raise ValueError(f"an inline tool takes one required argument by name; {name} takes "
                         f"{[p.name for p in required + others]}")
    return required[0].name


class ChatCalls:
    """TRL's route for chat models: a tool call ends the assistant's turn, and the tool answers in a message.

    The calls are read by TRL's response parser (``trl.chat_template_utils.parse_response``),
    and the tool's message is rendered by the chat template, exactly as TRL's
    ``GRPOTrainer._get_tool_suffix_ids`` renders it. Needs ``trl`` (an optional extra)
    and a template that passes TRL's ``supports_tool_calling``.
    """

    def __init__(self, tokenizer: Any, tools: Sequence[Callable]) -> None:
        from .chat import chat_call_helpers  # imports trl

        self.tools = list(tools)
        self._parse, self._suffix = chat_call_helpers(tokenizer, self.tools)

    def stop_ids(self, tokenizer: Any) -> list[int]:
        return []  # a call ends the turn: the row stops at its EOS

    def calls(self, tokenizer: Any, prefix_ids: list[int], turn_ids: list[int], ended: bool,
              tools: dict[str, Callable]) -> list[dict] | None:
        # a turn cut off by the budget is parsed too, as TRL parses it: a whole call in it is run and
        # counted, and its answer, which cannot fit, is rolled back
        if not turn_ids:
            return None
        try:
            calls = self._parse(prefix_ids, turn_ids)
        except (RecursionError, ValueError, TypeError, KeyError, AttributeError, IndexError, UnicodeError):
            # what the model wrote broke the response parser (JSON nested past the recursion limit, say): a
            # malformed call, as TRL treats one its parser refuses (TRL catches ValueError and TypeError only)
            return None
        return calls if isinstance(calls, list) and all(isinstance(c, dict) for c in calls) else None

    def suffix_ids(self, tokenizer: Any, results: list[tuple[str, Any]]) -> list[int]:
        return self._suffix(results)

    def check(self, tools: dict[str, Callable]) -> None:
        pass


class _StopAtCall:
    """A ``generate`` stopping criterion: a row stops when it has just written a call (per row, as HF allows)."""

    def __init__(self, syntax: Any, tokenizer: Any) -> None:
        self.syntax, self.tokenizer, self.start = syntax, tokenizer, None  # start: the prompts' width
        # a call is read in the whole row (a prompt may open it: "347*56=<<", as chapter 16's probe does)
        self.ids = torch.tensor(syntax.stop_ids(tokenizer), dtype=torch.long)
        self.stopped_at: dict[int, int] = {}  # row -> its length when it stopped

    def __call__(self, input_ids: torch.Tensor, scores: Any = None, **kwargs: Any) -> torch.Tensor:
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        if self.start is None:  # called first after the first new token
            self.start = input_ids.shape[1] - 1
        if not len(self.ids):
            return done
        last = input_ids[:, -1]
        for row in torch.nonzero(torch.isin(last, self.ids.to(last.device))).flatten().tolist():
            if row in self.stopped_at:
                continue
            text = self.tokenizer.decode(input_ids[row].tolist(), skip_special_tokens=True)
            if self.syntax.pending(text) is not None:
                self.stopped_at[row] = input_ids.shape[1] - self.start
                done[row] = True
        return done


@dataclass
class ToolBox:
    """The tools of a run and how they are called: TRL's ``tools=`` and ``max_tool_calling_iterations``.

    Attributes:
        tools: plain Python functions (TRL's form: type hints and a docstring with ``Args:``).
        syntax: :class:`InlineCalls` or :class:`ChatCalls`.
        max_tool_calling_iterations: rounds of calls at most (None: no limit; TRL's name).
        time_limit: seconds each call may take (ours; TRL has no limit; None: no limit).
    """

    tools: dict[str, Callable]
    syntax: Any
    max_tool_calling_iterations: int | None = None
    time_limit: float | None = 10.0
    rollout_time_limit: float | None = 60.0
    longest_token: int = 1

    @classmethod
    def build(cls, tools: Sequence[Callable], tokenizer: Any, *, chat: bool,
              max_tool_calling_iterations: int | None = None, time_limit: float | None = 10.0,
              rollout_time_limit: float | None = 60.0) -> "ToolBox":
        """A tool box for ``tools``: :class:`ChatCalls` for a chat model (``chat``), else :class:`InlineCalls`.

        ``time_limit``: seconds one call may take; ``rollout_time_limit``: seconds all the calls of one
        rollout may take together (ours: TRL has neither). Each is checked here, and so is an inline
        tool's signature (one required argument), so that a bad tool fails when the run starts."""
        if callable(tools) or isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
            raise TypeError(f"tools must be a list of functions, as TRL takes them; got {type(tools).__name__}")
        if not tools or not all(callable(t) for t in tools):
            raise TypeError(f"tools must be a non-empty list of functions; got {tools!r}")
        named = {getattr(t, "__name__", type(t).__name__): t for t in tools}
        if len(named) != len(tools):
            raise ValueError(f"two tools share a name: {[getattr(t, '__name__', '?') for t in tools]}")
        check_int("ToolBox", "max_tool_calling_iterations", max_tool_calling_iterations, 0, optional=True)
        check_time_limit("ToolBox", "time_limit", time_limit, expected="a number > 0")
        check_time_limit("ToolBox", "rollout_time_limit", rollout_time_limit, expected="a number > 0")
        syntax = ChatCalls(tokenizer, tools) if chat else InlineCalls()
        syntax.check(named)
        # the most characters one token can write back: a result longer than the budget times this cannot fit
        longest = max((len(token) for token in tokenizer.get_vocab()), default=1)
        return cls(named, syntax, max_tool_calling_iterations, time_limit, rollout_time_limit, max(1, longest))


#: Why a ``sampler=`` function cannot take the step's tools (the step raises it as a ValueError).
NO_TOOLS_FOR_A_FUNCTION = (
    "tools= cannot be used with a sampler= function: a tool rollout pauses at each call and continues from "
    "the token ids, and a sampler function writes whole completions from the prompts. Leave sampler= out "
    "(the policy samples, or GRPOConfig.sampler's copy), pass a grpo_tutorial.sampling.Sampler (which the step "
    "hands the tools), or run the tools inside your sampler")


def tool_box(tools: Sequence[Callable] | None, tokenizer: Any, config: Any) -> ToolBox | None:
    """The step's :class:`ToolBox` for ``tools`` under ``config`` (None without tools).

    Every sampler the package builds can pause for a call and continue from token ids: the
    policy (eager, with merged adapters, with the static cache) and chapter 15's copies
    (``config.sampler``); the step hands each the tool box (:attr:`~grpo_tutorial.sampling.Sampler.toolbox`).
    A ``sampler=`` function of the user's writes whole completions its own way, from
    prompts, so the step refuses it with tools (:data:`NO_TOOLS_FOR_A_FUNCTION`).
    """
    if tools is None:
        return None
    chat = uses_chat_template(tokenizer, config.use_chat_template)
    return ToolBox.build(tools, tokenizer, chat=chat, max_tool_calling_iterations=config.max_tool_calling_iterations,
                         time_limit=config.tool_time_limit, rollout_time_limit=config.tool_rollout_time_limit)


def generate_tool_rollouts(model: Any, tokenizer: Any, prompts: Sequence[Any], toolbox: ToolBox, *,
                           group_size: int, max_new_tokens: int, generator_seed: int | None = None,
                           answered: dict | None = None, **sampling: Any) -> Rollout:
    """G completions per prompt, each free to call the tools: :func:`~grpo_tutorial.rollout.generate_rollouts`
    for the first turn (all B*G rows in one call), then one batched call per round over the rows a tool answered.

    ``max_new_tokens`` is the budget of the whole completion, the tool's tokens included (TRL's
    ``max_completion_length``). ``sampling``: the rest of :func:`generate_rollouts`' settings.
    ``answered``: calls already answered, ``(row, call number, name, arguments) -> (result, failed)``; a
    call found there is not run again (a sampler that makes a rollout again, as the guarded float16
    copy does, passes one dict to both, so that no tool runs twice for the same call), and every call
    run is added to it.
    Returns a :class:`~grpo_tutorial.rollout.Rollout` with ``tool_mask``, ``tool_calls`` and
    ``tool_failures`` (``[N]``, calls made and failed per row).
    """
    syntax = toolbox.syntax
    stopper = _StopAtCall(syntax, tokenizer)
    described = syntax.tools if isinstance(syntax, ChatCalls) else None  # TRL describes the tools in the prompt
    first = generate_rollouts(model, tokenizer, prompts, group_size=group_size, max_new_tokens=max_new_tokens,
                              generator_seed=generator_seed, stopping_criteria=[stopper], tools=described, **sampling)
    stopper_lengths = stopper.stopped_at  # rows that stopped at a call, and their lengths
    lengths = first.completion_lengths.long().tolist()
    ids = first.completion_ids.cpu().tolist()
    N, stops = len(ids), set(stop_token_ids(model, tokenizer))
    prompt_rows = [row[m.bool()].tolist() for row, m in zip(first.prompt_ids.cpu(), first.prompt_mask.cpu())]
    completion = [ids[i][: stopper_lengths.get(i, lengths[i])] for i in range(N)]
    tool_mask = [[1] * len(c) for c in completion]
    calls_made, failures = [0] * N, [0] * N
    turn_start = [0] * N
    device = first.completion_ids.device

    def asked(i: int) -> list[dict] | None:
        turn = completion[i][turn_start[i]:]
        ended = bool(turn) and turn[-1] in stops
        return syntax.calls(tokenizer, prompt_rows[i] + completion[i][: turn_start[i]], turn, ended, toolbox.tools)

    pending = {i: c for i in range(N) if (c := asked(i))}
    limit = toolbox.max_tool_calling_iterations
    rounds = 0
    deadline = None if toolbox.rollout_time_limit is None else time.monotonic() + toolbox.rollout_time_limit
    answered = {} if answered is None else answered
    while pending and (limit is None or rounds < limit):
        suffixes = _answer(toolbox, tokenizer, pending, answered, deadline, calls_made, failures,
                           {i: max_new_tokens - len(completion[i]) for i in pending})
        for i, suffix in suffixes.items():
            completion[i] += suffix
            tool_mask[i] += [0] * len(suffix)
            turn_start[i] = len(completion[i])
        going = [i for i in suffixes if len(completion[i]) < max_new_tokens]
        rounds += 1
        if going:
            new = _continue(model, tokenizer, syntax, [prompt_rows[i] + completion[i] for i in going],
                            [max_new_tokens - len(completion[i]) for i in going],
                            None if generator_seed is None else generator_seed + 100_003 * rounds, sampling)
            for i, turn in zip(going, new):
                turn = turn[: max_new_tokens - len(completion[i])]  # each row's own budget
                completion[i] += turn
                tool_mask[i] += [1] * len(turn)
        pending = {i: c for i in going if (c := asked(i))}

    return _assemble(first, tokenizer, completion, tool_mask, calls_made, failures, stops, device)


def _answer(toolbox: ToolBox, tokenizer: Any, pending: dict[int, list], answered: dict, deadline: float | None,
            calls_made: list[int], failures: list[int], rooms: dict[int, int]) -> dict[int, list[int]]:
    """One round: run each pending row's calls (TRL's rules, our time limits; a call in ``answered`` is not run
    again), count them, and return the tokens that answer each row whose answer fits its ``rooms`` (the others
    are rolled back: their calls stay unanswered)."""
    suffixes: dict[int, list[int]] = {}
    for i, calls in pending.items():
        results = []
        for call in calls:
            key = _call_key(i, calls_made[i], call)
            if key not in answered:
                answered[key] = _run(toolbox, call, deadline)
            name, result, failed = answered[key]
            calls_made[i] += 1
            failures[i] += int(failed)
            results.append((name, result))
        suffix, unwritable = _suffix(toolbox, tokenizer, results, rooms[i])
        failures[i] += unwritable
        if suffix is not None and len(suffix) <= rooms[i]:
            suffixes[i] = suffix
    return suffixes


def _call_key(row: int, number: int, call: Any) -> tuple:
    """What identifies one call of a rollout: its row, its number in the row, and what it asks (as text)."""
    return row, number, safe_text(call)


def _text_result(tool: Callable) -> Callable:
    """``tool`` whose result is turned into text in the call's own thread, within its time limit (an error result,
    ``{"error": ...}``, stays one)."""
    def call(**arguments: Any) -> Any:
        result = tool(**arguments)
        if isinstance(result, dict) and "error" in result:
            return {"error": safe_text(result["error"])}
        return result if isinstance(result, list) else safe_text(result)  # a list: content blocks, as TRL passes
    call.__name__ = getattr(tool, "__name__", "tool")
    return call


def _run(toolbox: ToolBox, call: Any, deadline: float | None = None) -> tuple[str, Any, bool]:
    """One call: ``(tool name, result, failed)``. TRL's rule for a call type other than ``"function"``
    (an error result, a failure); the rest is :func:`~grpo_tutorial.tools.calculator.run_tool_call`'s, within
    the call's time limit and what is left of the rollout's (``deadline``, ``time.monotonic()``'s clock)."""
    if not isinstance(call, dict) or call.get("type") != "function":
        kind = call.get("type") if isinstance(call, dict) else type(call).__name__
        return "unknown", {"error": f"Unsupported tool call type: {safe_text(kind)}"}, True
    function = call.get("function") if isinstance(call.get("function"), dict) else {}
    name = safe_text(function.get("name", "unknown"))
    limit = toolbox.time_limit
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            return name, {"error": "the rollout's time for tool calls ran out"}, True
        limit = left if limit is None else min(limit, left)
    tools = {key: _text_result(tool) for key, tool in toolbox.tools.items()}
    result, failed = run_tool_call(tools, name, function.get("arguments"), limit)
    return name, result, failed


#: The error result of a tool's answer that the tokenizer cannot write back as it is.
UNWRITABLE = {"error": "the result holds characters this model's tokenizer cannot write"}


def writable(tokenizer: Any, text: str) -> bool:
    """Whether ``tokenizer`` writes ``text`` back as it is: every character in its vocabulary (none lost to
    ``<unk>``) and none of it read as a special token (a literal ``<eos>`` would end the row)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    return not special.intersection(ids) and tokenizer.decode(ids) == text


def _suffix(toolbox: ToolBox, tokenizer: Any, results: list[tuple[str, Any]], room: int) -> tuple[list[int] | None, int]:
    """The tokens that answer one row's calls, or None where they cannot fit in ``room`` tokens; and how many of
    the results the tokenizer could not write (each replaced by :data:`UNWRITABLE`, a failure).

    A result longer than ``room`` times the longest token's characters cannot fit: it is rolled back before
    the tokenizer reads it, so a tool that answers ten megabytes costs no tokenization."""
    texts = [result if isinstance(result, list) else safe_text(result) for _, result in results]
    if sum(len(t) for t in texts if isinstance(t, str)) > room * toolbox.longest_token:
        return None, 0
    checked, unwritable = [], 0
    for (name, result), text in zip(results, texts):
        error = isinstance(result, dict) and "error" in result
        if not error and isinstance(text, str) and not writable(tokenizer, text):
            result, unwritable = dict(UNWRITABLE), unwritable + 1
        checked.append((safe_text(name), result))
    return toolbox.syntax.suffix_ids(tokenizer, checked), unwritable


def _continue(model: Any, tokenizer: Any, syntax: Any, rows: list[list[int]], budgets: list[int], seed: int | None,
              sampling: dict[str, Any]) -> list[list[int]]:
    """One batched ``generate`` call that continues ``rows`` (token ids, no re-tokenization); each row's new turn.

    ``budgets``: the tokens each row may still write. The call generates up to the largest of them, but never
    past the model's context (``max_position_embeddings``) for the longest row: left-padded, every row's
    positions advance together. Where that cap cuts a row short of its budget, the rows still writing go on
    in one more call (rarely: rows of very different lengths near the context's end)."""
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    stops = set(stop_token_ids(model, tokenizer))
    turns: list[list[int]] = [[] for _ in rows]
    active, part = list(range(len(rows))), 0
    while active:
        rows_now = [rows[r] + turns[r] for r in active]
        want = max(budgets[r] - len(turns[r]) for r in active)
        max_new = want if not isinstance(context, int) else min(want, context - max(len(row) for row in rows_now))
        if max_new <= 0:
            break
        stopper = _StopAtCall(syntax, tokenizer)
        out = generate_from_ids(model, tokenizer, rows_now, max_new_tokens=max_new,
                                generator_seed=None if seed is None else seed + 7_919 * part,
                                stopping_criteria=[stopper],
                                **{k: sampling[k] for k in ("temperature", "top_p", "do_sample", "onednn",
                                                             "logits_processor") if k in sampling})  # [n, T_new]
        going = []
        for j, (r, row) in enumerate(zip(active, out.tolist())):
            end = stopper.stopped_at.get(j, len(row))
            cut = next((k + 1 for k, t in enumerate(row[:end]) if t in stops), end)
            turns[r] += row[:cut][: budgets[r] - len(turns[r])]
            open_ = cut == len(row) and j not in stopper.stopped_at and (not row or row[-1] not in stops)
            if max_new < want and open_ and len(turns[r]) < budgets[r]:  # cut short by the context cap only
                going.append(r)
        active, part = going, part + 1
    return turns


def _assemble(first: Rollout, tokenizer: Any, completion: list[list[int]], tool_mask: list[list[int]],
              calls: list[int], failures: list[int], stops: set[int], device: torch.device) -> Rollout:
    """The rows as one :class:`Rollout`: completions right-padded, ``completion_mask`` 1 on every kept token."""
    pad = pad_token_id(tokenizer)
    width = max(1, max(len(c) for c in completion))
    ids = torch.full((len(completion), width), pad, dtype=torch.long)
    mask = torch.zeros((len(completion), width))
    tmask = torch.ones((len(completion), width))  # padded with 1, as TRL pads it (the completion mask is 0 there)
    for i, (row, tm) in enumerate(zip(completion, tool_mask)):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1.0
        tmask[i, : len(tm)] = torch.tensor(tm, dtype=torch.float32)
    truncated = torch.tensor([not row or row[-1] not in stops for row in completion])  # TRL's rule: no EOS at the end
    return Rollout(
        prompt_ids=first.prompt_ids, prompt_mask=first.prompt_mask, completion_ids=ids.to(device),
        completion_mask=mask.to(device), completions=tokenizer.batch_decode(completion, skip_special_tokens=True),
        truncated=truncated.to(device), prompt_index=first.prompt_index, prompts=first.prompts,
        group_size=first.group_size, tool_mask=tmask.to(device),
        tool_calls=torch.tensor(calls, device=device), tool_failures=torch.tensor(failures, device=device),
    )
