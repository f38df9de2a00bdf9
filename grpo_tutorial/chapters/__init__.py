"""Tools for single chapters of the book, kept apart from the GRPO core.

The core (``grpo_tutorial`` top level) is the method itself; nothing in it imports
from here. Each module below serves the chapter named next to it, and its notebook
imports it as ``from grpo_tutorial.chapters.<module> import ...``:

=======  ====================  ==================================================================
Chapter  Module                What it holds
=======  ====================  ==================================================================
0-11     ``diagram``           the picture of one GRPO step, whole or with one stage highlighted
1        ``bandit``            the multi-armed bandit: REINFORCE, baselines, GRPO on a toy policy
5        ``kl_estimators``     exact KLs, estimator bias and spread, the KL-regularised optimum
6        ``reward_design``     reward-hacking audits, format and monitor rewards
7        ``inspection``        per-token tables and heatmaps of one training step
0, 8     ``recipes``           the tiny-addition recipe (warm start + GRPO), held-out evaluation
0, 9     ``costs``             model state and logits memory, PPO vs GRPO, updates bfloat16 loses
9        ``gsm8k``             the GPU run (Qwen2.5 on GSM8K) as one function, two scorers, probe, CPU run's data
9        ``gpu_estimates``     a step and a session on a T4: roofline, peaks, memory, chapter 9's estimate
9        ``colab``             the run's folder (named by its settings, on Drive in Colab), resume plan, Drive quota
9        ``run_record``        the run record a learner shares; the shared ones (``data/community/``), validated
10       ``pitfalls``          the bug gallery: a written-out step with bug switches
11       ``trl_multiprocess``  TRL's GRPOTrainer in two CPU processes (torchrun)
12       ``lab``               the variant lab: runs, statistics, pass@k
13       ``thinking``          long addition guessed or worked out: warm start, variants, statistics
14       ``low_rank``          LoRA against full fine-tuning: the sweep over ranks and learning rates
15       ``mismatch_lab``      a sampler that is not the learner: the sweep over samplers and corrections
12-15    ``sweep``             the sweep runner of 14 and 15 (a setting from a seed's warm start), 12's seed start
16       ``tool_use``          multiplication with a calculator in the loop: warm start, variants, statistics
17       ``no_critic``         GRPO, RLOO, PPO with a value model and Monte Carlo values on long addition
18       ``doctor_zoo``        the zoo of runs with one planted fault each, and healthy ones, for the doctor
=======  ====================  ==================================================================

This package ``__init__`` imports nothing, so importing one chapter's tools does
not load the others.
"""
