"""The command line's flags: what ``python -m grpo_tutorial`` parses, and the run settings and config they make.

:mod:`grpo_tutorial.__main__` holds the commands and builds this parser with them:

- :func:`build_parser`: one subcommand each (``train``, ``evaluate``, ``plot``, ``export``), each subcommand's
  flags in its own function; ``train`` has one flag per :class:`~grpo_tutorial.config.GRPOConfig` field, made
  from the dataclass with the field docs as help, so a new field is a new flag;
- :data:`RUN_DEFAULTS` and :func:`resolve_run_defaults`: what ``train`` does where a flag is left out, by kind of
  model; :data:`RUN_FIELDS`: the fields a command-line run sets where its preset keeps the config's default;
- :func:`config_from_args`: the run's ``GRPOConfig`` (the preset, then the flags); :func:`parse_rewards`: the
  ``--reward NAME[:WEIGHT]`` flags as reward functions and weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import typing
from typing import Any, Callable, Mapping, Sequence

from .advantages import BASELINES, MULTI_OBJECTIVE_AGGREGATIONS, SCALES, STDS
from .config import IS_MODES, REPORT_TO, SAMPLERS, GRPOConfig, field_docs
from .kl import KL_KINDS
from .objectives import IMPORTANCE_SAMPLING_LEVELS, LOSS_TYPES
from .presets import PRESETS, get_preset

__all__ = [
    "FIELD_ALIASES", "FIELD_CHOICES", "RUN_DEFAULTS", "RUN_FIELDS", "TASKS", "build_parser", "config_from_args",
    "is_tiny", "model_kind", "parse_rewards", "resolve_run_defaults",
]

TASKS = ("addition", "multiplication", "countdown", "gsm8k")

#: What ``train`` does where a flag is left out, by kind of model ("tiny", or "chat" for any
#: other). The tiny model's are chapter 8's recipe (``chapters.recipes.TinyAdditionRecipe``:
#: its GRPO preset, data split, warm start and single thread; tests/test_cli.py checks that they
#: agree), with 200 GRPO steps where the recipe makes 400: the held-out accuracy has risen
#: most of the way by then. Other models get the SmolLM2 CPU run's preset and no warm start.
RUN_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        preset="tiny-cpu", model="tiny", task="addition", steps=200, n_train=20_000, n_eval=1_000, n_probe=200,
        sft_steps=1_000, sft_target_accuracy=0.3, sft_check_every=10, threads=1,
    ),
    "chat": dict(
        preset="smollm2-cpu", task="addition", steps=200, n_train=20_000, n_eval=200, n_probe=200,
        sft_steps=0, sft_target_accuracy=None, sft_check_every=10, threads=None,
    ),
}

#: GRPOConfig fields that a command-line run sets where its preset leaves them at the
#: config's default and no flag is given: a checkpoint every 50 steps (so ``--resume`` has
#: something to continue from) and 4 completions every 50 steps, shown under the progress
#: bar and kept in ``OUT/completions.jsonl``. (The chapters' presets keep runs in memory.)
RUN_FIELDS: dict[str, Any] = dict(checkpoint_every=50, log_completions=True, log_every=50, num_completions_to_print=4)

#: The allowed values of the GRPOConfig fields that take one of a few names.
FIELD_CHOICES: dict[str, Sequence[str]] = {
    "kl_kind": KL_KINDS,
    "loss_type": LOSS_TYPES,
    "importance_sampling_level": IMPORTANCE_SAMPLING_LEVELS,
    "advantage_baseline": BASELINES,
    "scale_rewards": SCALES,
    "multi_objective_aggregation": MULTI_OBJECTIVE_AGGREGATIONS,
    "std": STDS,
    "report_to": REPORT_TO,
    "sampler": SAMPLERS,
    "vllm_importance_sampling_mode": IS_MODES,
}

#: Short names that stay beside the generated ``--field-name`` flags.
FIELD_ALIASES: dict[str, str] = {"learning_rate": "--lr", "output_dir": "--out"}


class _DefaultsOnceFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Append "(default: X)" only where the help text does not state the default
    itself, and never "(default: None)" or "(default: False)" (an absent flag)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or any(action.default is v for v in (None, False, argparse.SUPPRESS)):
            return text
        return super()._get_help_string(action)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=None,
        help="'tiny', 'smollm2-135m-instruct', a Hugging Face id (online) or a local folder (train's default: tiny)",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:0 ... (default: cuda if available)")
    p.add_argument("--dtype", default="float32",
                   help="the weights' format: float32, bf16 or fp16 (default: float32 on every device; "
                   "AdamW's small updates round away in 16-bit weights)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1 for the tiny model, else torch's choice)")


def _add_task_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", choices=TASKS, default=None, help="which problems to train/evaluate on (train's default: addition)")
    p.add_argument("--digits", type=int, default=None, help="operand digits for addition/multiplication (default 2, 1 for chat models' multiplication)")
    p.add_argument("--data-seed", type=int, default=None, help="seed of the generated problems (default: --seed)")


def _plain(doc: str) -> str:
    """A field doc as terminal text: reST roles and double backquotes dropped, ``%`` escaped for argparse."""
    doc = re.sub(r":[a-z]+:`~?([^`]*)`", lambda m: m.group(1).rsplit(".", 1)[-1], doc)
    return doc.replace("``", "").replace("%", "%%")


def _optional(convert: Any, what: str) -> Any:
    def parse(text: str) -> Any:
        if text.strip().lower() == "none":
            return None
        try:
            return convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} or 'none', got {text!r}") from None

    parse.__name__ = what  # argparse names the type in its own errors
    return parse


def _tri_state(text: str) -> bool | None:
    value = {"true": True, "false": False, "none": None}.get(text.strip().lower(), "bad")
    if value == "bad":
        raise argparse.ArgumentTypeError(f"expected true, false or none, got {text!r}")
    return value


def _add_config_args(group: argparse._ArgumentGroup) -> None:
    """One flag per GRPOConfig field, named after it, with the field's doc as help.

    The default is ``argparse.SUPPRESS``: a flag left out is absent from the parsed
    namespace, so the preset's value stays, and a field that may be None takes
    ``none`` as a value.
    """
    docs = field_docs()
    hints = typing.get_type_hints(GRPOConfig)
    for f in dataclasses.fields(GRPOConfig):
        hint = hints[f.name]
        args = typing.get_args(hint)
        optional = type(None) in args
        base = next((a for a in args if a is not type(None)), hint) if optional else hint
        listing = any(typing.get_origin(a) is list for a in args)  # str | list[str]: one name or several
        names = [f"--{f.name.replace('_', '-')}"] + ([FIELD_ALIASES[f.name]] if f.name in FIELD_ALIASES else [])
        if f.name == "output_dir":
            names.reverse()  # the usage line and the examples say --out
        kwargs: dict[str, Any] = dict(dest=f.name, default=argparse.SUPPRESS, help=_plain(docs[f.name]))
        if base is bool and not optional:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif base is bool:
            kwargs.update(type=_tri_state, metavar="{true,false,none}")
        elif typing.get_origin(base) is list:
            item = typing.get_args(base)[0]
            kwargs.update(nargs="+", type=_optional(item, item.__name__), metavar=item.__name__.upper())
        elif base is str and listing:
            kwargs.update(nargs="+", type=_optional(str, "str"), metavar="NAME")
        elif f.name in FIELD_CHOICES:
            kwargs["choices"] = list(FIELD_CHOICES[f.name]) + (["none"] if optional else [])
        elif base in (int, float):
            kwargs.update(type=_optional(base, base.__name__) if optional else base, metavar=base.__name__.upper())
        elif base is str:
            kwargs.update(type=_optional(str, "str") if optional else str, metavar="TEXT")
        else:
            raise TypeError(f"GRPOConfig.{f.name} has the type {hint}, which the command line cannot parse yet")
        if f.name == "output_dir":
            kwargs.update(required=True, metavar="DIR", type=str, help=kwargs["help"] + (
                " The command line also writes run.json, eval.json and completions.jsonl there."))
        group.add_argument(*names, **kwargs)


def _add_train(subparsers: Any, command: Callable[[argparse.Namespace], int]) -> None:
    """``train``'s flags: the run's, then one per GRPOConfig field; ``command`` runs it."""
    t = subparsers.add_parser(
        "train",
        help="run GRPO and write history.jsonl, checkpoints and eval.json",
        usage="%(prog)s --out DIR [--resume] [--preset NAME] [--model MODEL] [--task TASK] [--steps N] "
        "[--FIELD-NAME VALUE ...]",
        description="Run GRPO. With no flag but --out: the tiny model learns 2-digit addition (chapter 8's "
        "recipe: a supervised warm start, then GRPO with the tiny-cpu preset, held-out accuracy before and "
        "after). Every GRPOConfig field is a flag; a field left out takes the preset's value.",
        formatter_class=_DefaultsOnceFormatter,
    )
    t.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="the named GRPOConfig every field flag starts from (default: tiny-cpu for the tiny model, "
                   "smollm2-cpu for any other)")
    _add_model_args(t)
    _add_task_args(t)
    t.add_argument("--steps", type=int, default=None, help="total GRPO steps; a resumed run stops at the same step (default: 200)")
    t.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint if it exists")
    t.add_argument("--n-train", type=int, default=None, help="training problems to generate (default: 20000)")
    t.add_argument("--n-eval", type=int, default=None, help="held-out problems for the evaluations (default: 1000 for the tiny model, else 200)")
    t.add_argument("--n-probe", type=int, default=None,
                   help="held-out problems, apart from the evaluation's, that decide when the warm start stops (default: 200)")
    t.add_argument("--eval-before", action=argparse.BooleanOptionalAction, default=True,
                   help="greedy accuracy on the held-out set before GRPO")
    t.add_argument("--eval-after", action=argparse.BooleanOptionalAction, default=True,
                   help="greedy accuracy on the held-out set after GRPO")
    t.add_argument(
        "--reward",
        action="append",
        default=None,
        metavar="NAME[:WEIGHT]",
        help="reward function, repeatable: correctness, format, partial_credit, countdown "
        "(default: the task's own, countdown for countdown, else correctness); e.g. "
        "--reward correctness --reward format:0.2",
    )
    t.add_argument("--sft-steps", type=int, default=None,
                   help="supervised warm-start steps before GRPO, at most (default: 1000 for the tiny model, else 0)")
    t.add_argument("--sft-target-accuracy", type=_optional(float, "float"), default=argparse.SUPPRESS, metavar="FLOAT",
                   help="stop the warm start once greedy accuracy on the probe set reaches this; 'none' to run "
                   "every step (default: 0.3 for the tiny model, else none)")
    t.add_argument("--sft-check-every", type=int, default=None, help="warm-start steps between probe checks (default: 10)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_config_args(t.add_argument_group("GRPOConfig fields (default: the preset's value)"))
    t.set_defaults(func=command)


def _add_evaluate(subparsers: Any, command: Callable[[argparse.Namespace], int]) -> None:
    """``evaluate``'s flags; ``command`` runs it."""
    e = subparsers.add_parser(
        "evaluate",
        help="greedy accuracy of a model or checkpoint on held-out problems",
        description="Greedy evaluation. With --checkpoint pointing at a train --out directory, "
        "--model, --task and the other settings default to that run's.",
        formatter_class=_DefaultsOnceFormatter,
    )
    _add_model_args(e)
    _add_task_args(e)
    e.add_argument("--checkpoint", default=None, help="a train --out directory or a checkpoint directory")
    e.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="without --checkpoint: the settings to evaluate with (default: as train's)")
    e.add_argument("--n", type=int, default=None, help="number of held-out problems (default: the run's --n-eval, else 200)")
    e.add_argument("--seed", type=int, default=None, help="the run's seed (default: from run.json, else 0)")
    e.add_argument("--max-new-tokens", type=int, default=None)
    e.add_argument("--system-prompt", default=None)
    e.add_argument("--batch-size", type=int, default=None, help="prompts per generate call")
    e.add_argument("--out", default=None, help="write the result as JSON here")
    e.set_defaults(func=command)


def _add_plot(subparsers: Any, command: Callable[[argparse.Namespace], int]) -> None:
    """``plot``'s flags; ``command`` runs it."""
    p = subparsers.add_parser(
        "plot",
        help="draw the training curves of a history.jsonl",
        description="Plot reward, accuracy, KL, clip fraction, length and zero-std fraction against the step.",
        formatter_class=_DefaultsOnceFormatter,
    )
    p.add_argument("history", help="a run directory or its history.jsonl")
    p.add_argument("--out", required=True, help="image file to write (png, pdf, svg)")
    p.add_argument("--smooth", type=int, default=None, help="moving-average window in steps")
    p.add_argument("--keys", nargs="+", default=None, help="history keys to plot (default: the standard six)")
    p.set_defaults(func=command)


def _add_export(subparsers: Any, command: Callable[[argparse.Namespace], int]) -> None:
    """``export``'s flags; ``command`` runs it."""
    x = subparsers.add_parser(
        "export",
        help="save a run's policy as one plain model folder (LoRA: the adapters merged into the base)",
        description="Load a train --out directory's checkpoint (a LoRA run's adapters on its base, merged with "
        "merge_and_unload) and save the model and its tokenizer with save_pretrained, so that --model DIR, "
        "load_policy(DIR) or any transformers code loads it.",
        formatter_class=_DefaultsOnceFormatter,
    )
    x.add_argument("--checkpoint", required=True, help="a train --out directory or a checkpoint directory")
    x.add_argument("--out", required=True, help="the folder to write (created)")
    x.add_argument("--device", default=None, help="cpu, cuda, cuda:0 ... (default: cuda if available)")
    x.add_argument("--dtype", default="float32", help="the weights' format while merging: float32, bf16 or fp16")
    x.set_defaults(func=command, model=None, threads=None)


def _add_doctor(subparsers: Any, command: Callable[[argparse.Namespace], int]) -> None:
    """``doctor``'s flags; ``command`` runs it."""
    d = subparsers.add_parser(
        "doctor",
        help="read a run and say why it is not learning (chapter 18)",
        description="Read a run (a train --out directory, whole or still being written; TRL's output folder or "
        "trainer_state.json; TensorBoard events) and print the doctor's findings, the primary one first. Exit code: "
        "0 no fault, 1 a fault, 2 a run it cannot read.",
        formatter_class=_DefaultsOnceFormatter,
    )
    d.add_argument("run", help="a run directory, a history.jsonl, TRL's trainer_state.json or a TensorBoard folder")
    d.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    d.set_defaults(func=command, model=None, threads=None)


def build_parser(commands: Mapping[str, Callable[[argparse.Namespace], int]]) -> argparse.ArgumentParser:
    """The command line's parser: one subcommand per entry of ``commands`` (train, evaluate, plot, export, doctor), whose
    function the parsed arguments carry as ``func``."""
    parser = argparse.ArgumentParser(
        prog="python -m grpo_tutorial",
        description="GRPO from the ground up: train, evaluate, plot, export and diagnose from the command line.",
    )
    parser.add_argument("--traceback", action="store_true", help="show full tracebacks instead of one-line errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,evaluate,plot,export,doctor}")

    _add_train(sub, commands["train"])
    _add_evaluate(sub, commands["evaluate"])
    _add_plot(sub, commands["plot"])
    _add_export(sub, commands["export"])
    _add_doctor(sub, commands["doctor"])
    return parser


def model_kind(model_name: str | None) -> str:
    """The kind of model :data:`RUN_DEFAULTS` is keyed by: "tiny" for the tiny model (the default), else "chat"."""
    return "tiny" if model_name is None or is_tiny(model_name) else "chat"


def resolve_run_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill every run setting left out (None) from :data:`RUN_DEFAULTS` for the model's kind, in place."""
    defaults = RUN_DEFAULTS[model_kind(args.model)]
    for name, value in defaults.items():
        if name == "sft_target_accuracy":  # 'none' is a value (None), so only absence means "left out"
            if not hasattr(args, name):
                args.sft_target_accuracy = value
        elif getattr(args, name, None) is None:
            setattr(args, name, value)
    return args


def config_from_args(args: argparse.Namespace) -> GRPOConfig:
    """The run's GRPOConfig: the preset, then :data:`RUN_FIELDS` where the preset keeps the
    config's default, then every field flag given (``--reward NAME:WEIGHT`` sets ``reward_weights``)."""
    preset = get_preset(args.preset)
    defaults = GRPOConfig()
    values = {name: value for name, value in RUN_FIELDS.items() if getattr(preset, name) == getattr(defaults, name)}
    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    values.update({name: value for name, value in vars(args).items() if name in names})
    for name, choices in FIELD_CHOICES.items():
        if values.get(name) == "none" and "none" not in choices:
            values[name] = None  # an Optional field with choices: 'none' is None
    for name, value in list(values.items()):
        if isinstance(value, list) and None in value:  # a list field: '--reward-weights none' is None
            if len(value) > 1:
                raise ValueError(f"--{name.replace('_', '-')}: 'none' stands alone, got {value}")
            values[name] = None
    _scale_minibatch(preset, values)
    if args.reward:
        if "reward_weights" in vars(args):
            raise ValueError("give reward weights either with --reward NAME:WEIGHT or with --reward-weights, not both")
        values["reward_weights"] = parse_rewards(args.reward)[1]
    return get_preset(args.preset, **values)


def _scale_minibatch(preset: GRPOConfig, values: dict[str, Any]) -> None:
    """A batch size changed on the command line keeps the preset's number of optimizer
    updates per pass (tiny-cpu: two minibatches), where the new batch divides evenly,
    unless ``--minibatch-size`` is given; otherwise one update per pass, said aloud."""
    if "minibatch_size" in values or preset.minibatch_size is None:
        return
    batch = values.get("prompts_per_step", preset.prompts_per_step) * values.get("group_size", preset.group_size)
    if batch == preset.prompts_per_step * preset.group_size:
        return
    updates = preset.prompts_per_step * preset.group_size // preset.minibatch_size
    if batch % updates == 0:
        values["minibatch_size"] = batch // updates
    else:
        values["minibatch_size"] = None
        print(f"note: the preset's {updates} minibatches do not divide a batch of {batch} completions; "
              "one optimizer update per pass (give --minibatch-size to choose)", file=sys.stderr, flush=True)


def is_tiny(model_name: str) -> bool:
    """Whether ``--model`` names the tiny model built in code."""
    return model_name.strip().lower() == "tiny"


def parse_rewards(specs: Sequence[str]) -> tuple[list, list[float]]:
    """``["correctness", "format:0.2"]`` -> reward functions and their weights."""
    from .rewards import correctness_reward, format_reward, partial_credit_reward
    from .tasks import countdown_reward

    named = {
        "correctness": correctness_reward,
        "format": format_reward,
        "partial_credit": partial_credit_reward,
        "countdown": countdown_reward,
    }
    fns, weights = [], []
    for spec in specs:
        name, _, weight = spec.partition(":")
        if name not in named:
            raise ValueError(f"--reward {spec!r}: unknown reward {name!r}; expected one of {sorted(named)}")
        try:
            value = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(f"--reward {spec!r}: the weight {weight!r} is not a number") from None
        fns.append(named[name])
        weights.append(value)
    return fns, weights
