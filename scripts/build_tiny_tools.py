"""Build the shipped `builtin:tiny-tools` (maintainers only): builtin:tiny, warm-started further so
that it sometimes calls the calculator on the tools task (configs/tools_smoke.toml), and print
what the build does.

    uv run python scripts/build_tiny_tools.py                  # rewrites mlx_grpo/builtin/tiny_tools/
    uv run python scripts/build_tiny_tools.py --out /tmp/tt    # somewhere else, to compare

The targets are episodes of the task: with probability p(question) the model calls the
calculator, reads the tool message (context, not a target) and answers with its result;
otherwise it answers at once, a 3-digit sum it rarely gets right. p runs from 0.3 for a first
operand in the 100s to 0.8 in the 900s, so the greedy choice differs between questions and GRPO
has a behaviour to select. The tool message's tokens are made by the rollout's own
`tool_turn_text`, so the warm start and the rollouts see the same ids. Like builtin:tiny, the
result depends on the machine (BLAS, threads, backend): users load the shipped bytes.
"""

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import mlx_lm
from mlx_lm.utils import save_config, save_model

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "examples"))

from calculator_tools import calculator, last_answer  # noqa: E402
from make_sums_data import sums_rows  # noqa: E402

from mlx_grpo.data.chat import prompt_messages, render_text  # noqa: E402
from mlx_grpo.models.builtin import SHIPPED, builtin_model_path, write_manifest  # noqa: E402
from mlx_grpo.tools import Toolset  # noqa: E402
from mlx_grpo.tools.calls import tool_turn_text  # noqa: E402

# configs/tools_smoke.toml's data.system_prompt: the two forms a turn may take
SYSTEM = "Answer as <answer>N</answer>, or call the calculator first."
WARM_START = {"steps": 2000, "batch_size": 8, "learning_rate": 1e-3, "warmup": 50, "p_low": 0.3, "p_high": 0.8,
              "seed": 0}


def call_text(expression: str) -> str:
    return f'<tool_call>{json.dumps({"name": "calculator", "arguments": {"expression": expression}})}</tool_call>'


def tool_probability(question: str, low: float, high: float) -> float:
    first = int(question.removeprefix("What is ")[0])  # 1 .. 9
    return low + (high - low) * (first - 1) / 8


def episode_ids(tokenizer, row: dict, calls: bool, schemas) -> tuple[list[int], list[float]]:
    """Token ids of prompt + episode, and 1.0 where a token is a target."""
    enc = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    eos = tokenizer.eos_token_id
    prompt = enc(render_text(tokenizer, prompt_messages(row["question"], SYSTEM), {"tools": schemas}))
    answer = enc(f"<answer>{row['answer']}</answer>") + [eos]
    ids, mask = list(prompt), [0.0] * len(prompt)
    if calls:
        expression = row["question"].removeprefix("What is ").removesuffix("?")
        turn = enc(call_text(expression)) + [eos]
        tool = enc(tool_turn_text(tokenizer, [("calculator", calculator(expression))], True, {"tools": schemas}))
        ids += turn + tool
        mask += [1.0] * len(turn) + [0.0] * len(tool)
    return ids + answer, mask + [1.0] * len(answer)


def warm_start(model, tokenizer, steps, batch_size, learning_rate, warmup, p_low, p_high, seed) -> None:
    schemas = Toolset([calculator]).schemas
    rng = random.Random(seed)
    rows = sums_rows("train")
    examples = [episode_ids(tokenizer, r, rng.random() < tool_probability(r["question"], p_low, p_high), schemas)
                for r in rows]
    length = max(len(ids) for ids, _ in examples)
    pad = tokenizer.pad_token_id or 0
    tokens = mx.array([ids + [pad] * (length - len(ids)) for ids, _ in examples])
    masks = mx.array([m[1:] + [0.0] * (length - len(m)) for _, m in examples])  # position t predicts t + 1

    def loss_fn(model, batch, mask):
        ce = nn.losses.cross_entropy(model(batch[:, :-1]), batch[:, 1:])
        return (ce * mask).sum() / mask.sum()

    schedule = optim.join_schedules([optim.linear_schedule(learning_rate / 10, learning_rate, warmup),
                                     optim.cosine_decay(learning_rate, steps - warmup, learning_rate / 10)], [warmup])
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.0)
    optimizer.init(model.trainable_parameters())
    state = [model.state, optimizer.state]
    loss_and_grad = nn.value_and_grad(model, loss_fn)

    def step(batch, mask):
        loss, grads = loss_and_grad(model, batch, mask)
        optimizer.update(model, grads)
        return loss

    step = mx.compile(step, inputs=state, outputs=state)
    model.train()
    order = list(range(len(examples)))
    for i in range(steps):
        if i * batch_size % len(order) == 0:
            rng.shuffle(order)
        j = (i * batch_size) % len(order)
        idx = mx.array(order[j:j + batch_size])
        loss = step(tokens[idx], masks[idx])
        mx.eval(loss, state)
        if i % 50 == 0 or i == steps - 1:
            print(f"warm start step {i}: loss {loss.item():.3f}", file=sys.stderr)
    model.eval()


def fingerprint(model, tokenizer, rows: list[dict], seed: int = 0) -> dict:
    """Tool-call rate and accuracy on held-out questions, greedy and sampled (temperature 1)."""
    from mlx_grpo.rollout.episodes import EpisodeLimits, generate_episodes
    from mlx_grpo.rollout.sample import make_rollout_sampler
    from mlx_grpo.tools.calls import ToolFormat

    toolset = Toolset([calculator])
    kwargs = {"tools": toolset.schemas}
    prompts = [tokenizer.encode(render_text(tokenizer, prompt_messages(r["question"], SYSTEM), kwargs),
                                add_special_tokens=False) for r in rows]
    out = {}
    mx.random.seed(seed)
    for name, temperature in (("greedy", 0.0), ("sampled", 1.0)):
        rollout = generate_episodes(
            model, tokenizer, prompts, [toolset.episode(r) for r in rows], group_size=1, fmt=ToolFormat.of(tokenizer),
            limits=EpisodeLimits(96, 3, 0, 256), sampler=make_rollout_sampler(temperature, 1.0, 0, 0.0),
            schemas=toolset.schemas, timeout_s=5.0, template_kwargs=kwargs)
        right = [last_answer(e["messages"]) == str(r["answer"]) for e, r in zip(rollout.episodes, rows)]
        out[f"{name}_accuracy"] = round(sum(right) / len(rows), 4)
        out[f"{name}_call_rate"] = round(sum(e["tool_calls"] > 0 for e in rollout.episodes) / len(rows), 4)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(SHIPPED / "tiny_tools"), help="folder to write (replaced)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    tiny = builtin_model_path("tiny")
    model, tokenizer = mlx_lm.load(str(tiny))
    mx.random.seed(WARM_START["seed"])
    warm_start(model, tokenizer, **WARM_START)
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        for f in tiny.iterdir():
            if f.name.startswith("tokenizer") or f.name == "config.json":
                shutil.copy(f, Path(tmp) / f.name)
        save_config(json.loads((tiny / "config.json").read_text()), Path(tmp) / "config.json")
        save_model(tmp, model)
        write_manifest(Path(tmp))
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(tmp, out)
    print(f"built {out} in {time.perf_counter() - start:.0f} s with {json.dumps(WARM_START)}", file=sys.stderr)
    model, tokenizer = mlx_lm.load(str(out))
    print(json.dumps(fingerprint(model, tokenizer, sums_rows("test")), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
