"""Tools in the loop (chapter 16, TRL's ``tools=``): stage 1 with a pause at each tool call.

- :mod:`~grpo_tutorial.tools.loop`: rollouts with tools, batched round by round (a row
  stops at its call, the tool answers, the rows answered go on in one more call), and
  the rules for a failing, unknown or late call; the two call syntaxes, ``InlineCalls``
  and ``ChatCalls``; the step's :class:`ToolBox`, which every sampler of
  :mod:`grpo_tutorial.sampling` is handed;
- :mod:`~grpo_tutorial.tools.calculator`: the tool the chapters use, exact arithmetic
  from a parser that runs nothing it reads, and any tool's call with a time limit;
- :mod:`~grpo_tutorial.tools.chat`: tools with a chat model, through TRL's own response
  parser and tool-message code (needs the ``trl`` extra; imported only when used).

The loop's names are importable from here (``from grpo_tutorial.tools import ToolBox``).
"""

from __future__ import annotations

from .loop import NO_TOOLS_FOR_A_FUNCTION, ChatCalls, InlineCalls, ToolBox, generate_tool_rollouts, tool_box, writable

__all__ = ["NO_TOOLS_FOR_A_FUNCTION", "ChatCalls", "InlineCalls", "ToolBox", "generate_tool_rollouts", "tool_box",
           "writable"]
