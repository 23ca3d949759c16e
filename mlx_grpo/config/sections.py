"""Every default of a run: one dataclass per TOML section, and `Config`, which holds them all.
Stdlib only."""

from dataclasses import dataclass, field

# The R1-style format that the xml_format and gsm8k_correctness rewards look for.
DEFAULT_SYSTEM_PROMPT = (
    "Respond in the following format:\n"
    "<reasoning>\n...\n</reasoning>\n"
    "<answer>\n...\n</answer>"
)


@dataclass
class ModelConfig:
    path: str = "builtin:tiny"  # hub id, local folder, or builtin:NAME
    dtype: str = "auto"  # bfloat16 on Metal, float32 on the CPU backend (models/load.resolve_dtype)
    quantize_bits: int = 0  # 0 = keep the weights as they are
    quantize_group_size: int = 64
    trust_remote_code: bool = False


@dataclass
class LoraConfig:
    enabled: bool = False  # False = full fine-tune
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    # "all-linear" = every linear layer of the adapted blocks, whatever the family calls them (for
    # Qwen, Llama and Gemma q/k/v/o_proj and gate/up/down_proj); else block-relative names such
    # as "self_attn.q_proj"
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    num_layers: int = -1  # -1 = all layers, else the last N (as mlx-lm counts)
    method: str = "lora"  # "dora" = weight-decomposed LoRA (mlx-lm's DoRA layers)
    resume_adapter: str = ""  # an adapter folder to start from; "" = fresh adapters

    @property
    def scale(self) -> float:
        """mlx-lm's LoRA layers take `scale` (= alpha / rank), not alpha."""
        return self.alpha / self.rank


@dataclass
class DataConfig:
    # hub id, local file (the split "train" alone), builtin:NAME, or a table of local files
    # by split, e.g. {train = "data/gsm8k_train.jsonl", test = "data/gsm8k_test.jsonl"}
    dataset: str | dict[str, str] = "builtin:arithmetic"
    subset: str = ""  # hub config name; "" = none (an error for local and builtin data)
    split: str = "train"
    prompt_field: str = "question"
    answer_field: str = "answer"  # "" = no reference answers
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    system_field: str = ""  # a field holding each row's own system prompt, in place of system_prompt; "" = none
    # passed to the chat template where prompts are rendered (TRL's chat_template_kwargs), e.g.
    # {enable_thinking = false}: a Qwen3-style prompt then closes an empty <think> block
    chat_template_kwargs: dict[str, bool | int | float | str] = field(default_factory=dict)
    max_prompt_tokens: int = 512
    shuffle: bool = True


@dataclass
class GenerationConfig:
    num_generations: int = 8  # G, completions per prompt
    max_new_tokens: int = 512  # TRL's max_completion_length
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # 0 = off
    batch_size: int = 0  # sequences generated at once; 0 = all of a step's sequences
    quantize_bits: int = 0  # 4 or 8: sample from a quantized copy of the current policy; 0 = off
    # "compiled": our decode loop, one compiled step of fixed shapes (rollout/engine.py); "batch_generator":
    # mlx-lm's; "auto": compiled where the model's layers all keep a plain or sliding-window KV cache and no
    # quantized copy samples, else batch_generator.
    engine: str = "auto"
    # With [tools] (rollout/episodes.py): max_new_tokens is then per model turn
    max_turns: int = 4  # model turns an episode may have (each after the first follows tool results)
    max_tool_calls: int = 0  # tool calls an episode may make; 0 = no limit (calls past it get an error)
    max_episode_tokens: int = 0  # sampled + tool tokens of an episode; 0 = max_new_tokens * max_turns


@dataclass
class GRPOConfig:
    beta: float = 0.0  # KL penalty; 0 = no reference model (TRL's default since 0.19)
    epsilon: float = 0.2
    epsilon_high: float | None = None  # upper clip; None = epsilon (resolved by load_config)
    loss_type: str = "dapo"
    scale_rewards: str = "group"
    num_iterations: int = 1  # optimizer passes over each rollout
    mask_truncated_completions: bool = False
    importance_sampling_level: str = "token"  # "sequence" = GSPO
    top_entropy_quantile: float = 1.0  # train on the top share of tokens by entropy; 1 = all
    # Sampler/trainer mismatch (TRL's vLLM importance sampling): "none", "token_truncate",
    # "sequence_mask", or "auto" = token_truncate when top_p/top_k/min_p or quantized rollouts
    # make the sampled distribution differ from the scored one, else none
    importance_sampling_correction: str = "auto"
    importance_sampling_cap: float = 3.0  # upper bound of the weights (TRL's clip_max)
    importance_sampling_floor: float = 0.0  # lower bound (TRL's clip_min; 0 = none)
    dynamic_sampling: bool = False  # DAPO: drop groups with equal rewards and draw more
    max_resample_rounds: int = 4  # extra draws per step under dynamic_sampling
    overlong_penalty: float = 0.0  # DAPO soft overlong punishment at the cap; 0 = off
    overlong_buffer: int = 32  # tokens before max_new_tokens where the penalty ramps up


@dataclass
class RewardConfig:
    name: str  # a built-in, "module:function", "path/file.py:function", or "judge" (a model that scores)
    weight: float = 1.0  # 0 = log the metric without training on it
    # The judge's keys (name = "judge" alone, mlx_grpo/judge/; unset = JUDGE_DEFAULTS, filled in at load):
    model: str | None = None  # hub id, local HF or MLX folder (a quantized one too), builtin:NAME; required
    template: str | None = None  # its prompt: {prompt}, {completion}, {answer}, any data field; "" = the default
    parse: str | None = None  # "number": the number it answers; "yes_no": P(yes) / (P(yes) + P(no)) of its next token
    mode: str | None = None  # "single"; "group": one request ranks a prompt's G completions ({completions})
    max_new_tokens: int | None = None  # greedy tokens it may answer with (parse = "number", mode = "group")
    batch_size: int | None = None  # requests decoded at once


JUDGE_DEFAULTS = {"template": "", "parse": "number", "mode": "single", "max_new_tokens": 64, "batch_size": 16}


@dataclass
class TrainingConfig:
    max_steps: int = 100
    prompts_per_step: int = 2
    gradient_accumulation_steps: int = 1
    micro_batch_size: int = 0  # sequences per forward/backward chunk; 0 = whole micro-batch
    learning_rate: float = 1e-6
    lr_schedule: str = "linear"  # to 0 at the last update, as transformers' default
    warmup_steps: float = 0  # optimizer updates; a value in (0, 1) is a share of all updates
    weight_decay: float = 0.0
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # bias-corrected AdamW
    max_grad_norm: float = 1.0  # 0 = no clipping
    grad_checkpoint: bool = False
    shared_prefix: bool = True  # each group's prompt runs once in every scoring pass (update, reference, old log-probs)
    max_bad_steps: int = 0  # steps with a NaN/inf loss or gradient to skip before stopping
    # one update at the longest shapes before step 1, so a run that cannot hold them stops now:
    # "auto" = when `mlx-grpo plan` puts the peak above half the device's memory; "always", "never"
    worst_case_first: str = "auto"
    # beta = 0 and no group with reward spread: the gradient is 0, skip AdamW's update (algorithm/zero_signal.py);
    # off: measured no better on average (docs/benchmarks.md, scripts/zero_signal_table.py)
    skip_zero_signal_steps: bool = False


@dataclass
class LoggingConfig:
    log_every: int = 1
    log_completions: int = 0  # completions printed per logged step (and kept in completions.jsonl)
    report_to: list[str] = field(default_factory=list)  # any of "tensorboard", "wandb", "trackio" (run/trackers.py)
    project: str = "mlx-grpo"  # the trackers' project
    run_name: str = ""  # the trackers' run name; "" = the output folder's name
    # Live warnings (mlx_grpo/watch.py); 0 turns a check off.
    warn_zero_std_frac: float = 0.9  # frac_reward_zero_std above this ... (warn_zero_std_steps = 0: off)
    warn_zero_std_steps: int = 10  # ... for this many steps in a row: no signal (0 = off)
    warn_grad_norm_factor: float = 10.0  # grad_norm above this times its running median
    warn_clipped_ratio: float = 0.5  # completions/clipped_ratio above this
    warn_kl: float = 1.0  # kl above this
    warn_reward_falling_steps: int = 50  # reward trending down over this many steps
    # Tripwires (mlx_grpo/run/tripwires.py); 0 turns one off.
    warn_truncated_rewarded: float = 0.1  # share of completions cut at the cap yet paid, above which it warns
    warn_format_window: int = 20  # W: a format reward's rise over 2W steps while correctness stays flat
    warn_eval_drop_se: float = 2.0  # the held-out score fell by more standard errors than this as training reward rose
    warn_unmoved_after: int = 10  # updates after which every trainable tensor must have changed


@dataclass
class CheckpointConfig:
    save_every: int = 50
    keep_last: int = 3
    resume: bool = False  # continue from the newest checkpoint in output_dir (as --resume)


@dataclass
class EvalConfig:
    every: int = 0  # evaluate every N training steps; 0 = off
    split: str = "test"
    limit: int = 0  # first N distinct held-out prompts; 0 = all
    num_samples: int = 1  # K > 1 adds maj@K and pass@K from K samples per prompt
    temperature: float = 1.0  # for the K samples; pass@1 is always greedy
    max_new_tokens: int = 0  # 0 = generation.max_new_tokens
    batch_size: int = 16  # prompts decoded at once (one progress-bar tick each)


@dataclass
class ToolsConfig:
    # "module:function" or "path/file.py:function": typed functions the model may call (tools/schema.py)
    functions: list[str] = field(default_factory=list)
    environment: str = ""  # "module:Class" or "path/file.py:Class": one instance per episode; "" = none
    timeout_s: float = 10.0  # a call running longer is answered with an error
    # where the model is shown the tools' schemas: "template" (the chat template's tools=), "system"
    # (a tool list added to the system message), "auto" (the template where it shows them, else the
    # system message), "none"
    schemas_in: str = "auto"


@dataclass
class DistributedConfig:
    # a collective's deadline (distributed.py, Watch): 0 = the larger of 60 s and 5 x the median
    # step time so far; a rank that misses it stops every rank with one line naming the late rank
    timeout_s: float = 0.0
    reduce_dtype: str = "float32"  # the gradient all-reduce's dtype; "bfloat16" sends half the bytes


@dataclass
class Config:
    seed: int = 0
    output_dir: str = "runs/default"
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    data: DataConfig = field(default_factory=DataConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    rewards: list[RewardConfig] = field(default_factory=lambda: [  # [[rewards]] replaces the list
        RewardConfig("gsm8k_correctness", 1.0), RewardConfig("xml_format", 0.5),
    ])
    reward_weights: list[float] = field(default_factory=list)  # TRL's: one per reward, in place of theirs; [] = theirs
    training: TrainingConfig = field(default_factory=TrainingConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
