"""Stage 1 with tools, chat models: how a tool call is read and how the tool's answer is written (TRL's route).

A chat model calls a tool by ending its assistant turn with a call in its template's
syntax (Qwen2.5's: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>``);
the tool's answer comes back as a *tool message*, which the chat template wraps, and
the assistant writes its next turn after the template's assistant header. Both halves
are TRL 1.16's own code, so that a rollout here is the one ``trl.GRPOTrainer(tools=...)``
builds for the same text:

* reading the calls: :func:`trl.chat_template_utils.parse_response`, with the turn's
  context as its prefix and the tools (for the arguments' types), as
  ``GRPOTrainer._generate`` and ``_tool_call_loop`` call it. A turn without a call, or
  with a malformed one (TRL's parser falls back to plain text), asks for nothing: the
  completion ends there.
* writing the answer: ``GRPOTrainer._get_tool_suffix_ids`` itself. It renders a dummy
  conversation (a user message and an assistant turn that calls the tool) twice, without
  and with the tool messages and the next assistant header, cuts the first rendering at
  its last EOS, and keeps what the second adds: the template's wrapper around the
  answers, exactly the tokens the tool (not the policy) wrote, all of them masked.

The template must render a whole tool exchange: TRL's ``supports_tool_calling``.
SmolLM2-135M-Instruct's own template does not (it drops the calls and the tool
messages); TRL's bundled Qwen2.5 template does, and TRL knows how to parse its
responses (``add_response_schema``). Qwen2.5-Instruct models ship that template.
``trl`` is an optional extra (``pip install -e .[trl]``), imported only here.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, Sequence

__all__ = ["QWEN2_5_TEMPLATE_HINT", "chat_call_helpers", "qwen2_5_chat_template", "supports_tool_calls",
           "tool_messages"]

#: How to get a template that supports tool calls, for the refusal's message.
QWEN2_5_TEMPLATE_HINT = (
    "set TRL's bundled Qwen2.5 chat template on the tokenizer "
    "(tokenizer.chat_template = grpo_tutorial.tools.chat.qwen2_5_chat_template(), which is "
    "trl.chat_template_utils.qwen2_5_chat_template, the file trl/chat_templates/qwen2_5.jinja), "
    "or use a model whose own template supports tools (Qwen2.5-Instruct's does)"
)


def qwen2_5_chat_template() -> str:
    """TRL's bundled Qwen2.5 chat template (``trl/chat_templates/qwen2_5.jinja``): the route for a tokenizer
    whose own template cannot render tool calls (SmolLM2's), and one TRL knows how to parse."""
    _trl()  # without trl: an ImportError that says how to get it
    from trl.chat_template_utils import qwen2_5_chat_template as template

    return template


def supports_tool_calls(tokenizer: Any) -> bool:
    """TRL's ``supports_tool_calling``: the tokenizer's template renders a whole tool exchange
    (user, assistant with a call, tool), keeping the call and the answer."""
    return bool(_trl().supports_tool_calling(tokenizer))


def tool_messages(results: Sequence[tuple[str, Any]]) -> list[dict]:
    """The tool messages of one round's results, in TRL's form: ``{"role": "tool", "name", "content"}``.

    The content is ``str(result)`` (an error result ``{"error": ...}`` included), except a list,
    which TRL passes as it is (content blocks, for multimodal tools)."""
    return [{"role": "tool", "name": name, "content": result if isinstance(result, list) else str(result)}
            for name, result in results]


def _trl() -> SimpleNamespace:
    """TRL's functions this module calls, or an ImportError that says how to get them."""
    try:
        import transformers
        from packaging.version import Version
        from trl.chat_template_utils import (
            add_response_schema, get_training_chat_template, is_chat_template_prefix_preserving, parse_response,
            supports_tool_calling,
        )
        from trl.trainer.grpo_trainer import GRPOTrainer
    except ImportError as error:
        raise ImportError(
            "tools with a chat model read the calls with TRL's response parser: install the trl extra "
            "(pip install -e '.[trl]', or pip install 'trl>=1.16,<1.17')"
        ) from error
    if Version(transformers.__version__) < Version("5.0.0"):
        raise ImportError(f"tools with a chat model need transformers >= 5.0 (TRL's rule; its tokenizers parse "
                          f"responses); installed: {transformers.__version__}")
    return SimpleNamespace(add_response_schema=add_response_schema, parse_response=parse_response,
                           get_training_chat_template=get_training_chat_template,
                           is_chat_template_prefix_preserving=is_chat_template_prefix_preserving,
                           supports_tool_calling=supports_tool_calling, GRPOTrainer=GRPOTrainer)


def chat_call_helpers(tokenizer: Any, tools: Sequence[Callable]) -> tuple[Callable, Callable]:
    """``(parse, suffix)`` for :class:`~grpo_tutorial.tools.ChatCalls`, as TRL's ``GRPOTrainer(tools=...)`` sets them up.

    ``parse(prefix_ids, turn_ids)``: the calls of one assistant turn, a list of
    ``{"type": "function", "function": {"name", "arguments"}}`` (TRL's form), or None when
    the turn asks for none (no call, or a malformed one). ``prefix_ids`` is everything
    before the turn (the prompt, the earlier turns and the tool messages).

    ``suffix(results)``: the token ids that answer one round's calls, ``results`` a list of
    ``(tool name, result)``: the tool messages in the template's wrapper, then the next
    assistant header.

    Like TRL's ``__init__``, this refuses a template that fails ``supports_tool_calling``,
    sets TRL's response parser on the tokenizer when it has none (``add_response_schema``:
    it changes ``tokenizer`` in place, as TRL does), and renders the tool messages with
    TRL's training template when the tokenizer's own is not prefix-preserving.
    """
    trl = _trl()
    if not trl.supports_tool_calling(tokenizer):
        raise ValueError(
            "the tokenizer's chat template does not support tool calls (TRL's supports_tool_calling: it must render "
            "user -> assistant with tool_calls -> tool, keeping the call and the tool's answer); "
            + QWEN2_5_TEMPLATE_HINT
        )
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        try:
            trl.add_response_schema(tokenizer)
        except ValueError as error:
            raise ValueError(f"TRL cannot parse this template's tool calls ({error}); {QWEN2_5_TEMPLATE_HINT}") from error
    chat_template = None
    if not trl.is_chat_template_prefix_preserving(tokenizer):
        chat_template = trl.get_training_chat_template(tokenizer)
    tools = list(tools)

    def parse(prefix_ids: list[int], turn_ids: list[int]) -> list[dict] | None:
        if not turn_ids:
            return None
        parsed = trl.parse_response(tokenizer, list(turn_ids), prefix=list(prefix_ids), tools=tools)
        return parsed.get("tool_calls") or None

    # TRL's _get_tool_suffix_ids reads these attributes of its trainer, and nothing else
    trainer = SimpleNamespace(processing_class=tokenizer, _tokenizer=tokenizer, chat_template=chat_template,
                              chat_template_kwargs={}, _is_vlm=False)

    def suffix(results: Sequence[tuple[str, Any]]) -> list[int]:
        try:
            return list(trl.GRPOTrainer._get_tool_suffix_ids(trainer, tool_messages(results)))
        except AttributeError as error:  # a TRL whose method reads more of its trainer than 1.16's
            raise RuntimeError(f"TRL's GRPOTrainer._get_tool_suffix_ids needs more than TRL 1.16's did ({error}); "
                               "this package supports trl>=1.16,<1.17") from error

    return parse, suffix
