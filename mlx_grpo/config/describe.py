"""What each config key means, in one place, and the reference page made from it.

`DESCRIPTIONS` holds one sentence per dotted key; the type, the default and the allowed values
come from the dataclasses (sections.py) and the rules (rules.py), so `reference_markdown()`,
which docs/configuration.md is, cannot drift from the code: tests/test_config_docs.py fails when
a key has no sentence, a sentence names no key, or the page differs. Stdlib only.
"""

import dataclasses
import json
import types
import typing

from mlx_grpo.config.rules import RULES
from mlx_grpo.config.sections import JUDGE_DEFAULTS, Config, RewardConfig

DESCRIPTIONS = {
    "seed": "Seeds MLX, NumPy and Python's random streams: the same seed on the same machine repeats a run.",
    "output_dir": "The run folder: config.toml, metrics.jsonl, completions.jsonl, checkpoints/.",
    "reward_weights": "One weight per `[[rewards]]` entry, in place of theirs, as TRL's reward_weights; empty keeps theirs.",
    # [model]
    "model.path": "A hub id, a local Hugging Face or MLX folder, `builtin:tiny`, `builtin:small`, or `shape:NAME` "
                  "(a published model's shape with random weights).",
    "model.dtype": "The weights' dtype when loaded: `auto` is bfloat16 on Metal and float32 on the CPU backend.",
    "model.quantize_bits": "Quantize the base to 4 or 8 bits once into the cache (QLoRA with LoRA on); 0 keeps it.",
    "model.quantize_group_size": "Weights sharing one quantization scale.",
    "model.trust_remote_code": "Let the tokenizer run the model's own code (off unless set).",
    # [lora]
    "lora.enabled": "Train LoRA/DoRA adapters on a frozen base; false is a full fine-tune.",
    "lora.rank": "The adapters' rank r.",
    "lora.alpha": "Scales the adapters' output by alpha / rank (mlx-lm's `scale`).",
    "lora.dropout": "Dropout on the adapters' input while training.",
    "lora.target_modules": "`all-linear` (every linear layer of the adapted blocks), or block-relative names "
                           "such as `self_attn.q_proj`.",
    "lora.num_layers": "Adapt the last N blocks; -1 adapts all.",
    "lora.method": "`lora`, or `dora` (weight-decomposed LoRA).",
    "lora.resume_adapter": "An adapter folder to start from; empty starts fresh adapters.",
    # [data]
    "data.dataset": "A hub id, a local .jsonl/.json/.parquet/.csv file, `builtin:arithmetic`, "
                    "or a table of local files by split (`{train = \"a.jsonl\", test = \"b.jsonl\"}`).",
    "data.subset": "A hub data set's config name; empty for none.",
    "data.split": "The split training reads.",
    "data.prompt_field": "The column holding the prompt: text, or a list of {role, content} messages.",
    "data.answer_field": "The column holding the reference answer the rewards compare with; empty for none.",
    "data.system_prompt": "The system message put before each text prompt (a conversation's own system message wins).",
    "data.system_field": "A field holding each row's own system prompt, used in place of system_prompt; empty for none.",
    "data.chat_template_kwargs": "Extra variables for the chat template wherever a prompt is rendered "
                                 "(TRL's), e.g. `{enable_thinking = false}`.",
    "data.max_prompt_tokens": "Prompts longer than this (after the chat template) are skipped and counted.",
    "data.shuffle": "Walk the training prompts in a seeded order, reshuffled each pass.",
    # [generation]
    "generation.num_generations": "G, the completions sampled per prompt.",
    "generation.max_new_tokens": "The most tokens a completion may have (TRL's max_completion_length).",
    "generation.temperature": "Sampling temperature; the loss scores the same tempered distribution.",
    "generation.top_p": "Nucleus sampling; 1 is off.",
    "generation.top_k": "Sample from the k likeliest tokens; 0 is off.",
    "generation.min_p": "Drop tokens below min_p times the likeliest one's probability; 0 is off.",
    "generation.batch_size": "The most sequences decoded at once; 0 decodes all of a step's at once.",
    "generation.quantize_bits": "Sample from a 4- or 8-bit copy of the current policy; 0 is off.",
    "generation.engine": "The decode loop: mlx-lm's `batch_generator`; `compiled`, one compiled step of fixed "
                         "shapes (models whose layers all keep a plain KV cache or a sliding window's, as Gemma "
                         "3's; a batch_size that splits a group falls back); or `auto` (the default), compiled "
                         "where the model allows it and no quantized copy samples (`quantize_bits` rebuilds it "
                         "after every update, and a compiled step would be traced again each time), else "
                         "BatchGenerator, said once at start. Same "
                         "sampled distribution, another random stream.",
    "generation.max_turns": "With tools: model turns an episode may have; one still calling tools after "
                            "its last is truncated.",
    "generation.max_tool_calls": "With tools: calls an episode may make (those past it are answered with an "
                                 "error); 0 is no limit.",
    "generation.max_episode_tokens": "With tools: sampled and tool tokens of an episode; one that would overflow "
                                     "it stops, truncated; 0 is max_new_tokens times max_turns.",
    # [grpo]
    "grpo.beta": "Weight of the KL penalty to the reference; 0 loads no reference.",
    "grpo.epsilon": "Lower clip of the importance ratio, 1 - epsilon.",
    "grpo.epsilon_high": "Upper clip, 1 + epsilon_high; unset is epsilon.",
    "grpo.loss_type": "How token losses become one number: `grpo`, `bnpo`, `dr_grpo` or `dapo`.",
    "grpo.scale_rewards": "Divide advantages by the group's reward std (`group`), the step's (`batch`), or not (`none`).",
    "grpo.num_iterations": "Optimizer updates on each step's completions.",
    "grpo.mask_truncated_completions": "Leave completions cut at max_new_tokens out of the loss.",
    "grpo.importance_sampling_level": "`token`, or `sequence` (GSPO: one ratio per completion).",
    "grpo.top_entropy_quantile": "Train the policy term on the top share of tokens by entropy; 1 trains on all.",
    "grpo.importance_sampling_correction": "Weight tokens by the sampler/trainer gap: `auto`, `none`, "
                                           "`token_truncate` or `sequence_mask`.",
    "grpo.importance_sampling_cap": "The largest importance-sampling weight.",
    "grpo.importance_sampling_floor": "The smallest importance-sampling weight.",
    "grpo.dynamic_sampling": "Drop groups whose rewards are all equal and draw more prompts (DAPO).",
    "grpo.max_resample_rounds": "Extra draws a step may make under dynamic_sampling.",
    "grpo.overlong_penalty": "DAPO's soft penalty at max_new_tokens; 0 is off.",
    "grpo.overlong_buffer": "Tokens before max_new_tokens over which that penalty ramps up.",
    # [[rewards]]
    "rewards.name": "A built-in reward, `package.module:function` or `path/file.py:function`.",
    "rewards.weight": "Its weight in the total; 0 logs it without training on it.",
    "rewards.model": "A judge's model (name = \"judge\"): hub id, local or quantized MLX folder, builtin:NAME.",
    "rewards.template": "A judge's prompt with {prompt}, {completion}, {answer} and any data field; empty is the default.",
    "rewards.parse": "A judge's score: `number` (the number it answers) or `yes_no` (P(yes) from its next token).",
    "rewards.mode": "A judge's requests: `single` (one a completion) or `group` (one ranks a prompt's G completions).",
    "rewards.max_new_tokens": "Tokens a judge may answer with.",
    "rewards.batch_size": "Judge requests decoded at once.",
    # [training]
    "training.max_steps": "Steps to train: each samples, scores and updates once.",
    "training.prompts_per_step": "Prompts (groups of G completions) in each accumulation part.",
    "training.gradient_accumulation_steps": "Parts of prompts_per_step prompts whose gradients one update sums.",
    "training.micro_batch_size": "Sequences per forward and backward pass; 0 runs a whole part at once.",
    "training.learning_rate": "AdamW's peak learning rate.",
    "training.lr_schedule": "After warmup: `linear` or `cosine` to 0 at the last update, or `constant`.",
    "training.warmup_steps": "Updates of linear warmup, or a share of all updates when in (0, 1).",
    "training.weight_decay": "AdamW's decoupled weight decay.",
    "training.adam_betas": "AdamW's two moment decay rates.",
    "training.max_grad_norm": "Clip the gradient's global norm to this; 0 does not clip.",
    "training.grad_checkpoint": ("Recompute each block's activations in the backward pass: less memory, more time. "
                                 "With LoRA, a shared-prefix micro-batch then holds one group."),
    "training.shared_prefix": "Run each group's prompt once per scoring pass instead of once per completion.",
    "training.max_bad_steps": "Steps with a NaN or inf loss or gradient to skip before the run stops.",
    "training.worst_case_first": "One update at the longest shapes before step 1: `auto`, `always` or `never`.",
    "training.skip_zero_signal_steps": "Skip AdamW on a step whose gradient is zero (beta 0, no reward spread).",
    # [logging]
    "logging.log_every": "Print a step's line every N steps (metrics.jsonl gets every step).",
    "logging.log_completions": "Sample completions printed per logged step and kept in completions.jsonl.",
    "logging.report_to": "Trackers that get the metrics: any of `tensorboard`, `wandb`, `trackio`.",
    "logging.project": "The trackers' project.",
    "logging.run_name": "The trackers' run name; empty is the output folder's name.",
    "logging.warn_zero_std_frac": "Warn when this share of groups has no reward spread ...",
    "logging.warn_zero_std_steps": "... for this many steps in a row; 0 is off.",
    "logging.warn_grad_norm_factor": "Warn when the gradient norm exceeds this times its running median; 0 is off.",
    "logging.warn_clipped_ratio": "Warn when this share of completions hits max_new_tokens; 0 is off.",
    "logging.warn_kl": "Warn when the KL to the reference exceeds this; 0 is off.",
    "logging.warn_reward_falling_steps": "Warn when the reward trends down over this many steps; 0 is off.",
    "logging.warn_truncated_rewarded": "Tripwire: this share of truncated completions still paid; 0 is off.",
    "logging.warn_format_window": "Tripwire: the format reward rises over this many steps while correctness "
                                  "stays flat; 0 is off.",
    "logging.warn_eval_drop_se": "Tripwire: the held-out score fell by more standard errors than this while the "
                                 "training reward rose; 0 is off.",
    "logging.warn_unmoved_after": "Tripwire: after this many updates every trainable tensor must have changed; 0 is off.",
    # [checkpoint]
    "checkpoint.save_every": "Write a checkpoint every N steps (and at the end).",
    "checkpoint.keep_last": "Checkpoints kept; older ones are deleted.",
    "checkpoint.resume": "Continue from the newest intact checkpoint in output_dir (as --resume).",
    # [eval]
    "eval.every": "Evaluate on the held-out split every N steps; 0 is off.",
    "eval.split": "The split evaluation reads.",
    "eval.limit": "Evaluate the first N distinct prompts; 0 is all.",
    "eval.num_samples": "K; above 1 adds maj@K and pass@K from K samples a prompt.",
    "eval.temperature": "Temperature of those K samples (pass@1 is greedy).",
    "eval.max_new_tokens": "Tokens an eval completion may have; 0 is generation.max_new_tokens.",
    "eval.batch_size": "Prompts decoded at once.",
    # [distributed]
    "distributed.timeout_s": "Seconds a rank waits at a collective for the others before every rank stops "
                             "with one line naming the late one; 0 is the larger of 60 s and 5 times the "
                             "median step time.",
    "distributed.reduce_dtype": "The gradient all-reduce's dtype across ranks: `float32`, or `bfloat16` "
                                "(half the bytes; its rounding is measured in docs/benchmarks.md).",
    # [tools]
    "tools.functions": "Typed functions the model may call, `package.module:function` or "
                       "`path/file.py:function` (docs/tools.md); the schema is made from their hints.",
    "tools.environment": "An environment class, `package.module:Class` or `path/file.py:Class`: one "
                         "instance per episode, `reset(**row)`, its public methods are tools; empty for none.",
    "tools.timeout_s": "Seconds a tool call may run before the model gets a timeout error.",
    "tools.schemas_in": "Where the model sees the tools' schemas: `template` (the chat template's "
                        "`tools=`), `system` (a tool list added to the system message), `auto` (the "
                        "template where it shows them, else the system message), `none`.",
}


def _type_name(hint) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint) if a is not type(None))
    if origin is list:
        return f"array of {_type_name(typing.get_args(hint)[0])}s"
    if origin is dict:
        return "table"
    return {bool: "boolean", int: "integer", float: "number", str: "string"}[hint]


def config_keys() -> list[tuple[str, str, object]]:
    """(dotted key, type, default) of every key, in the order of the dataclasses."""
    out = []

    def walk(cls, obj, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = f"{prefix}{f.name}"
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name], getattr(obj, f.name), key + ".")
            elif key == "rewards":
                walk(RewardConfig, None, "rewards.")
            else:
                default = getattr(obj, f.name) if obj is not None else (
                    f.default if f.default is not dataclasses.MISSING else None)
                if default is None and key.startswith("rewards."):  # a judge's key, filled in at load
                    default = JUDGE_DEFAULTS.get(f.name)
                out.append((key, _type_name(hints[f.name]), default))

    walk(Config, Config(), "")
    return out


def _show(value) -> str:
    """A default as a profile would write it."""
    if value is None:
        return "unset"
    if isinstance(value, str) and "\n" in value:
        return "(below)"
    return f"`{json.dumps(value)}`"


def reference_markdown() -> str:
    """docs/configuration.md: every key, its type, default, allowed values and meaning."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from `mlx_grpo/config/` by `uv run mlx-grpo config --reference`; a test fails when it",
        "differs, so it is never out of date. A profile lists only what it changes; `--set KEY=VALUE`",
        "overrides a key (TOML value syntax). `uv run mlx-grpo config --show [--config FILE] [--set ...]`",
        "prints the profile as it resolves, every default filled in, as TOML: redirect it to a file to",
        "start a profile of your own. How a step uses these keys: [the algorithm](algorithm.md).",
        "",
        "```bash",
        "uv run mlx-grpo config --show --config configs/smoke_test.toml --set training.max_steps=3",
        "```",
    ]
    section = None
    keys = config_keys()
    for key, kind, default in [k for k in keys if "." not in k[0]] + [k for k in keys if "." in k[0]]:
        head = key.split(".")[0] if "." in key else "top level"
        if head != section:
            section = head
            title = {"top level": "Top level", "rewards": "`[[rewards]]` (one table per reward)"}.get(
                head, f"`[{head}]`")
            lines += ["", f"## {title}", "", "| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
        allowed = RULES.get(key, (None, ""))[1]
        name = key.split(".", 1)[1] if "." in key else key
        default_text = _show(default) if key != "rewards.name" else "(required)"
        lines.append(f"| `{name}` | {kind} | {default_text} | {allowed} | {DESCRIPTIONS[key]} |")
    system = Config().data.system_prompt
    lines += ["", "The default `data.system_prompt`:", "", "<!-- output -->", "```text", system, "```", "",
              "The default `[[rewards]]`: " + ", ".join(f"`{r.name}` (weight {r.weight})" for r in Config().rewards)
              + "."]
    return "\n".join(lines) + "\n"
