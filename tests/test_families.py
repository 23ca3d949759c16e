"""Every family of the shape catalog, as its shrunk copy (same model_type and layer kinds, width
64, a 512-token vocabulary; models/shapes_catalog.py): two GRPO steps through the real `train`
(full and LoRA, training.shared_prefix on, a KL term, the worst-case probe first), `generate`,
`export`, the export reloaded by mlx-lm answering the same; the rollout's log-probs against the
scorer's; the GRPO loss's gradient against central finite differences; a chat of two turns."""

import random

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import pytest
from mlx.utils import tree_flatten

from mlx_grpo.algorithm.loss import completion_logprobs, split_head
from mlx_grpo.commands.chat import ChatSession
from mlx_grpo.commands.generate import generate_answer
from mlx_grpo.commands.setup import prefix_sharing
from mlx_grpo.commands.train import train
from mlx_grpo.config import load_config
from mlx_grpo.config.sections import ModelConfig
from mlx_grpo.data.chat import render_prompt
from mlx_grpo.models.export import export_model
from mlx_grpo.models.load import load_base
from mlx_grpo.models.named import load_model
from mlx_grpo.models.shapes import build_shape
from mlx_grpo.models.shapes_catalog import SHAPES
from mlx_grpo.rewards import RewardSet
from mlx_grpo.rollout.sample import Rollout, generate_completions, make_rollout_sampler, make_sampling_logprob
from mlx_grpo.update.batches import make_batches
from mlx_grpo.update.settings import UpdateSettings
from mlx_grpo.update.step import make_loss_fn

FAMILIES = sorted(SHAPES)
# Families whose layers cannot all share a prompt prefix: convolution, delta-net.
UNSHARED = {"lfm2-350m", "qwen3.5-0.8b"}
QUESTIONS = ["What is 2 + 3?", "What is 9 - 4 + 1?"]


@pytest.fixture(scope="module")
def shrunk(tmp_path_factory):
    """name -> the folder of that family's shrunk copy."""
    root = tmp_path_factory.mktemp("shrunk")
    return {name: str(build_shape(_mkdir(root / name), name, shrunk=True)) for name in FAMILIES}


def _mkdir(path):
    path.mkdir()
    return path


def _settings(out, folder, lora: bool) -> list[str]:
    return [f'model.path="{folder}"', f'output_dir="{out}"', "training.max_steps=2", "training.prompts_per_step=2",
            "generation.num_generations=2", "generation.max_new_tokens=16", f"lora.enabled={str(lora).lower()}",
            "lora.rank=4", "training.learning_rate=1e-2", "checkpoint.save_every=2", 'data.system_prompt="Be brief."',
            "grpo.beta=0.04", 'training.worst_case_first="always"']  # the reference pass and the probe too


def distinct_characters(prompts, completions, answers, **kwargs) -> list[float]:
    """A reward random completions differ in, so every step has a gradient."""
    return [float(len(set(c))) for c in completions]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("name", FAMILIES)
def test_two_steps_then_generate_export_and_mlx_lm_answers_the_same(tmp_path, shrunk, capsys, name, lora):
    out = tmp_path / "run"
    train(load_config(None, _settings(out, shrunk[name], lora)), progress=False,
          reward_set=RewardSet([(distinct_characters, 1.0)]))
    said = capsys.readouterr().out
    assert ("training.shared_prefix" in said) == (name in UNSHARED)  # the fallback, said once at start
    loaded = load_model(str(out))
    answer = generate_answer(loaded.model, loaded.tokenizer, QUESTIONS[0], system_prompt=loaded.system_prompt,
                             max_tokens=8)
    exported = export_model(str(out), str(tmp_path / "export"))
    model, tokenizer = mlx_lm.load(str(exported))
    # the export's template opens with the run's system prompt, so mlx-lm is asked as training asked
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[0]}], add_generation_prompt=True,
                                           tokenize=False)
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert prompt == render_prompt(loaded.tokenizer, QUESTIONS[0], "Be brief.")
    assert mlx_lm.generate(model, tokenizer, ids, max_tokens=8) == answer.text
    x = mx.array([ids])
    assert mx.allclose(model(x), loaded.model(x), atol=1e-5).item()  # the same function, not only the same argmax
    base, _, _ = load_base(ModelConfig(path=shrunk[name], dtype="float32"))
    assert not mx.allclose(model(x), base(x), atol=1e-5).item()  # and not the untrained base


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("engine", ["batch_generator", "auto"])
def test_rollout_logprobs_equal_the_scorers_with_each_prompt_prefilled_once(shrunk, name, engine):
    """mlx-lm's BatchGenerator, each prompt prefilled once and its cache handed to all G rows
    (attention, sliding-window, convolution and delta-net caches alike), and the compiled decode
    loop where the family can use it: every sampled token's log-prob equals the full-sequence
    forward's."""
    model, tokenizer, _ = load_base(ModelConfig(path=shrunk[name], dtype="float32"))
    prompts = [tokenizer.encode(render_prompt(tokenizer, q, "Be brief."), add_special_tokens=False) for q in QUESTIONS]
    mx.random.seed(0)
    rollout = generate_completions(model, tokenizer, prompts, num_generations=3, max_new_tokens=12,
                                   sampler=make_rollout_sampler(1.0, 1.0, 0, 0.0),
                                   sampling_logprob=make_sampling_logprob(1.0, 1.0, 0, 0.0), engine=engine)
    scored = completion_logprobs(model, rollout.prompt_tokens, rollout.completion_tokens)
    for i, sampled in enumerate(rollout.sampling_logprobs):
        assert mx.allclose(scored[i, :len(sampled)], mx.array(sampled), atol=1e-4).item(), (name, i)
    assert len({tuple(c) for c in rollout.completion_tokens}) > 1  # sampled, not one answer repeated


def _directional_difference(loss, array, direction, eps=1e-3) -> float:
    """(loss(w + eps d) - loss(w - eps d)) / 2 eps for the parameter `array` (changed in place,
    then put back): <gradient, d> to O(eps^2)."""
    old = mx.array(array)
    values = []
    for sign in (1, -1):
        array[...] = old + sign * eps * direction
        values.append(loss())
    array[...] = old
    return (values[0] - values[1]) / (2 * eps)


def _probes(params: dict) -> list[str]:
    """The token embedding, the first block's input projection and the last block's query
    projection: for the hybrids a convolution or delta-net block and an attention block."""
    mats = [n for n in params if ".layers." in n and n.endswith(".weight") and params[n].ndim == 2]
    last = max(int(n.split(".layers.")[1].split(".")[0]) for n in mats)
    first = next(n for key in ("in_proj_qkv", "in_proj", "q_proj") for n in mats if ".layers.0." in n and key in n)
    return [next(n for n in params if n.endswith("embed_tokens.weight")), first,
            next(n for n in mats if f".layers.{last}.self_attn.q_proj" in n)]


@pytest.mark.parametrize("name", FAMILIES)
def test_grpo_loss_gradient_agrees_with_finite_differences(shrunk, name):
    model, tokenizer, _ = load_base(ModelConfig(path=shrunk[name], dtype="float32"))
    cfg = load_config(None, [f'model.path="{shrunk[name]}"', "grpo.num_iterations=2", "generation.num_generations=2"])
    s = prefix_sharing(UpdateSettings.from_config(cfg), model, name)  # the shared path where the family has it
    prompts = [tokenizer.encode(render_prompt(tokenizer, q, "Be brief."), add_special_tokens=False) for q in QUESTIONS]
    rng = random.Random(0)
    completions = [[rng.randrange(300) for _ in range(n)] for n in (5, 9, 7, 3)]
    rollout = Rollout([p for p in prompts for _ in range(2)], completions, [""] * 4, [False] * 4, group_size=2)
    (batch,) = make_batches(model, None, rollout, mx.array([1.0, -1.0, 0.5, -0.5]), s)  # old_logp: constants
    model.train()
    loss_fn = make_loss_fn(s)
    loss = lambda: loss_fn(model, batch)[0].item()  # noqa: E731
    grads = dict(tree_flatten(nn.value_and_grad(model, loss_fn)(model, batch)[1]))
    params = dict(tree_flatten(model.parameters()))
    for probe in _probes(params):
        # +-1 on the 32 entries of largest gradient, 0 elsewhere: a single entry's gradient can be
        # ~1e-4, whose difference float32's rounding of the loss (~1e-8) would blur by a few percent
        g = grads[probe]
        top = mx.argsort(-mx.abs(g).reshape(-1))[:32]
        direction = mx.zeros(g.size).at[top].add(mx.sign(g.reshape(-1)[top])).reshape(g.shape)
        analytic = (g * direction).sum().item()
        # a step that moves the loss by about 1e-4: far above its rounding, small enough to be
        # linear (Gemma's embedding, scaled by sqrt(hidden), bends within 1e-3)
        eps = min(1e-3, 5e-5 / abs(analytic))
        numeric = _directional_difference(loss, params[probe], direction, eps)
        assert numeric == pytest.approx(analytic, rel=0.02), (name, probe)


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_scores_completions_through_its_head_alone(shrunk, name):
    """The vocabulary projection runs on completion positions only (a 150k-262k vocabulary over
    the prompt would dominate memory), and that equals the whole model's logits."""
    model, _, _ = load_base(ModelConfig(path=shrunk[name], dtype="float32"))
    body, head, _ = split_head(model)
    assert head is not None
    x = mx.array([[5, 9, 200, 7, 31]])
    assert mx.allclose(head(body(x)), model(x), atol=1e-5).item()


@pytest.mark.parametrize("name", FAMILIES)
def test_a_chat_keeps_its_cache_across_turns(shrunk, name):
    """The cache offset comes from an attention layer: a hybrid's first layer keeps a
    convolution or delta-net state, which has none (mlx-grpo chat stopped at the first answer)."""
    model, tokenizer, _ = load_base(ModelConfig(path=shrunk[name], dtype="float32"))
    session = ChatSession(model, tokenizer, system_prompt="Be brief.", max_tokens=4,
                          sampler=make_rollout_sampler(0.0, 1.0, 0, 0.0))
    session.reply(QUESTIONS[0])
    assert 0 < len(session.cached) <= len(tokenizer.encode(render_prompt(tokenizer, QUESTIONS[0], "Be brief."))) + 4
    session.reply(QUESTIONS[1])
    assert [m["role"] for m in session.messages] == ["system", "user", "assistant", "user", "assistant"]
