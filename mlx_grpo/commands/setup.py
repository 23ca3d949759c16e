"""What a run builds from its config before the first step, shared by `train`, `bench` and `eval`:
the policy and its reference, the rewards, the data, the sampler, the optimizer, and the settings
the rollout and the update read.

An entry point's helper, so it reads the whole config; everything it builds takes only the
values it needs.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from mlx_grpo.algorithm.prefix import unshared_cache_kinds
from mlx_grpo.data.examples import Example, check_token_ids, load_examples
from mlx_grpo.distributed import SINGLE, World, sampling_seed, sync_parameters
from mlx_grpo.errors import TrainingError
from mlx_grpo.models.adapters import load_adapter_weights
from mlx_grpo.models.load import add_adapters, checkpoint_layers, load_base
from mlx_grpo.models.reference import load_reference
from mlx_grpo.models.vocab import check_tokenizer_fits, embedding_rows
from mlx_grpo.rewards import RewardSet
from mlx_grpo.rollout.quantized import QuantizedRollouts
from mlx_grpo.rollout import engine as compiled_engine
from mlx_grpo.rollout.sample import make_rollout_sampler
from mlx_grpo.rollout.score import SamplingSettings
from mlx_grpo.rollout.tool_rollout import ToolRollout
from mlx_grpo.run.console import say
from mlx_grpo.tools import Toolset
from mlx_grpo.tools.prompt import schemas_placement, template_kwargs
from mlx_grpo.update.optimizer import make_optimizer
from mlx_grpo.update.settings import UpdateSettings
from mlx_grpo.update.step import make_update_grad_fn


def build_policy(cfg):
    """The trainable model, its tokenizer, the base's local path, adapted layer count."""
    if cfg.model.quantize_bits and not cfg.lora.enabled:
        raise TrainingError(
            "model.quantize_bits: quantized weights cannot be trained directly; "
            "set lora.enabled = true (QLoRA) or quantize_bits = 0"
        )
    model, tokenizer, base_path = load_base(cfg.model)
    num_layers = len(model.layers)
    if cfg.lora.enabled:
        num_layers = add_adapters(model, cfg.lora, use_dora=cfg.lora.method == "dora")
        if cfg.lora.resume_adapter:
            load_adapter_weights(model, cfg.lora.resume_adapter)
    if cfg.training.grad_checkpoint:
        checkpoint_layers(model)
    return model, tokenizer, base_path, num_layers


def make_rewards(cfg, config_path: str | None = None, group_size: int | None = None) -> RewardSet:
    """The configured rewards; a reward file's relative path is tried against the profile's folder.
    A judge's model loads now, so one that cannot load stops the run before its first step.

    `group_size` (completions per prompt, which a reward's error names the prompt by) defaults to
    generation.num_generations; eval scores one greedy completion per prompt and passes 1.
    """
    base_dir = Path(config_path).parent if config_path else None
    group_size = cfg.generation.num_generations if group_size is None else group_size
    items = [(judge_reward(r, cfg, group_size, f"rewards[{i}]") if r.name == "judge" else r.name, r.weight)
             for i, r in enumerate(cfg.rewards)]
    return RewardSet(items, base_dir=base_dir, group_size=group_size, weights=cfg.reward_weights)


def judge_reward(entry, cfg, group_size: int, setting: str):
    """A [[rewards]] entry's judge, on the policy's dtype (mlx_grpo/judge/)."""
    from mlx_grpo.judge import make_judge
    from mlx_grpo.models.load import resolve_dtype
    from mlx_grpo.run.console import say

    return make_judge(entry, resolve_dtype(cfg.model.dtype), group_size, setting, warn=say)


@dataclass
class Trainer:
    """The state one training run holds from its first step to its last."""

    model: object  # the policy
    tokenizer: object
    base_path: str  # the base's local folder, which checkpoints copy the model config from
    num_layers: int  # layers with adapters (all layers for a full fine-tune)
    ref_model: object | None  # a frozen copy of the base, or None (no KL term, or LoRA: adapters off)
    examples: list[Example]  # the training split
    sampler: Callable
    sampling: SamplingSettings
    settings: UpdateSettings
    optimizer: object
    grad_fn: Callable  # batch -> ((loss, metrics), grads), made once so a compiled one keeps its traces
    quantized: QuantizedRollouts | None = None  # generation.quantize_bits: the copy that samples
    tools: ToolRollout | None = None  # [tools]: multi-turn episodes (rollout/tool_rollout.py)

    def rollout_model(self):
        """The model that samples: the policy, or its quantized copy as of the last update. The
        policy is put in eval mode either way: the update's constant log-probs are scored in it."""
        self.model.eval()
        return self.quantized.model_for(self.model, self.optimizer) if self.quantized else self.model


def prefix_sharing(settings: UpdateSettings, model, model_path: str, world: World = SINGLE) -> UpdateSettings:
    """`settings` with training.shared_prefix off for a model whose layers cannot share a prompt
    prefix (algorithm/prefix.py), said once; such a model is scored on the padded path."""
    kinds = unshared_cache_kinds(model) if settings.shared_prefix else []
    if not kinds:
        return settings
    if world.is_main:
        say(f"mlx-grpo: training.shared_prefix: {model_path} has layers whose cache ({', '.join(kinds)}) cannot "
            "share a prompt prefix; each completion is scored with its own prompt (the padded path)")
    return replace(settings, shared_prefix=False)


def rollout_engine(cfg, model, world: World = SINGLE) -> str:
    """generation.engine resolved for this model: "compiled" or "batch_generator", said once where
    "auto" cannot compile it; "compiled" asked of a model it cannot run is refused."""
    asked = cfg.generation.engine
    why = compiled_engine.unsupported(model) if asked != "batch_generator" else None
    if why and asked == "compiled":
        raise TrainingError(f'generation.engine = "compiled": {cfg.model.path} cannot use it ({why}); '
                            'set it to "auto" or "batch_generator"')
    if asked == "auto" and not why and cfg.generation.quantize_bits:
        why = ("generation.quantize_bits: its quantized copy is rebuilt after every update, and a compiled "
               "step would be traced again each time")
    if why and world.is_main:
        say(f"mlx-grpo: generation.engine: {cfg.model.path} decodes with mlx-lm's BatchGenerator ({why})")
    return "batch_generator" if asked == "batch_generator" or why else "compiled"


def _with_tools(cfg, toolset: Toolset | None, tokenizer, world: World) -> dict:
    """data.chat_template_kwargs with the tools' schemas; says so once where "auto" puts them in the
    system message because the chat template does not show them."""
    kwargs = cfg.data.chat_template_kwargs
    if not toolset:
        return dict(kwargs)
    where = schemas_placement(tokenizer, toolset.schemas, kwargs, cfg.tools.schemas_in)
    if cfg.tools.schemas_in == "auto" and where == "system" and world.is_main:
        say(f"mlx-grpo: {cfg.model.path}'s chat template does not show tools; their schemas go in the system "
            "message (tools.schemas_in = \"auto\")")
    return template_kwargs(kwargs, toolset, tokenizer, where)


def setup(cfg, *, total_updates: int, world: World = SINGLE, rows: list[dict] | None = None,
          toolset: Toolset | None = None) -> Trainer:
    """Load the policy and its reference, then the data (`rows`, else cfg.data's training split);
    the sampling streams start from the seed. With a `toolset` the prompts show the chat template
    the tools' schemas, and the rollout runs episodes."""
    model, tokenizer, base_path, num_layers = build_policy(cfg)
    if cfg.generation.quantize_bits and any(isinstance(m, nn.QuantizedLinear) for m in model.modules()):
        raise TrainingError(
            f"generation.quantize_bits: {cfg.model.path} is stored quantized, so its rollouts already run on "
            "quantized weights; set generation.quantize_bits = 0"
        )
    ref_model = load_reference(cfg.model, base_path, beta=cfg.grpo.beta, lora=cfg.lora.enabled)
    sync_parameters(model, world)
    # Loading models draws random numbers (layer init before the weights arrive), and how many
    # depends on beta, LoRA and the reference; sampling starts from the seed whatever they are.
    mx.random.seed(sampling_seed(cfg.seed, world.rank))
    vocab = embedding_rows(model)
    if toolset and vocab is not None:
        check_tokenizer_fits(vocab, tokenizer, f"model.path: {cfg.model.path}",
                             "a tool's output or an environment's prompt")
    data = replace(cfg.data, chat_template_kwargs=_with_tools(cfg, toolset, tokenizer, world))
    examples = load_examples(data, tokenizer, seed=cfg.seed, rows=rows)
    if vocab is not None:
        check_token_ids(examples, vocab, f"model.path: {cfg.model.path}")
    gen, settings = cfg.generation, prefix_sharing(UpdateSettings.from_config(cfg), model, cfg.model.path, world)
    return Trainer(
        model, tokenizer, base_path, num_layers, ref_model, examples,
        sampler=make_rollout_sampler(gen.temperature, gen.top_p, gen.top_k, gen.min_p),
        sampling=replace(SamplingSettings.from_config(cfg), engine=rollout_engine(cfg, model, world)),
        settings=settings,
        optimizer=make_optimizer(cfg.training, total_updates), grad_fn=make_update_grad_fn(model, settings),
        quantized=QuantizedRollouts(gen.quantize_bits) if gen.quantize_bits else None,
        tools=ToolRollout.make(toolset, tokenizer, cfg, data.chat_template_kwargs) if toolset else None,
    )
