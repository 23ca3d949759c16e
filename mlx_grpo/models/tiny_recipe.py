"""The recipe of `builtin:tiny`: a tokenizer trained on the arithmetic chats and a short
supervised warm start, run by maintainers (`scripts/build_tiny.py`) to make the files that
ship in `mlx_grpo/builtin/tiny/`.

Users never run it: float rounding differs with the BLAS, its CPU kernels, the thread count
and Metal vs CPU, and after 1000 steps those differences give a model that behaves
differently. The recipe is kept so the shipped files can be rebuilt and read; the
behaviour fingerprint printed with them says what this build does.
"""

import random

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx_lm.models import qwen2
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_tokenizer, save_config, save_model

from mlx_grpo.data import arithmetic
from mlx_grpo.data.chat import DEFAULT_SYSTEM_PROMPT

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
OPERATOR_TOKENS = [" + ", " - ", " = "]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TOKENIZER_VOCAB_SIZE = 1024  # a ceiling: the small corpus runs out of merges at about 320 tokens

ARCH = {
    "model_type": "qwen2",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "intermediate_size": 384,
}
# Learnable by RL with room to improve: sampled at temperature 1 the model keeps the format
# and gets part of the held-out answers right. A two-step question is written either as worked
# steps or as one line ("2 + 7 - 3 = 6"), and the one line is wrong more often. How often a
# target takes the steps depends on the first operand (from `stepwise_low` for 0 to
# `stepwise_high` for 9), so the greedy choice differs from question to question instead of
# sitting on one 50/50 edge that float rounding could flip for all of them at once; GRPO then
# has a behaviour to select that carries over to held-out questions. Small batches matter: the
# model learns to copy the operands after about 100 steps at batch 8; at 32 not after 300.
WARM_START = {
    "steps": 1000,
    "batch_size": 8,
    "learning_rate": 3e-3,
    "warmup": 30,
    "weight_decay": 0.5,
    "stepwise_low": 0.1,
    "stepwise_high": 0.9,
    "seed": 0,
}


def stepwise_probability(question: str, low: float, high: float) -> float:
    """How often the warm start's target for `question` is the worked steps."""
    first = int(question.removeprefix("What is ")[0])
    return low + (high - low) * first / arithmetic.MAX_VALUE


def build(path, warm_start: dict = WARM_START) -> None:
    """Write the tokenizer, config and warm-started weights of builtin:tiny into `path`."""
    tokenizer = train_tokenizer()
    tokenizer.save_pretrained(path, save_jinja_files=False)  # the template stays in tokenizer_config.json
    config = {
        **ARCH,
        "vocab_size": len(tokenizer),
        "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
        "pad_token_id": tokenizer.pad_token_id,
    }
    save_config(dict(config), path / "config.json")
    mx.random.seed(0)
    model = qwen2.Model(qwen2.ModelArgs.from_dict(config))
    # Train on the tokenizer exactly as mlx_lm.load will give it back.
    _warm_start(model, load_tokenizer(path), **warm_start)
    mx.eval(model.parameters())
    save_model(path, model)


def _tokenizer_corpus() -> list[str]:
    """The chat text the model sees, cut at the special tokens as encoding will cut it."""
    corpus = []
    for row in arithmetic.make_problems(1000, seed=0, split="train"):
        corpus += [f"system\n{DEFAULT_SYSTEM_PROMPT}", "\n", f"user\n{row['question']}", "\n"]
        corpus += [f"assistant\n{arithmetic.format_completion(row)}", "\n"]
    return corpus


def train_tokenizer():
    """A byte-level BPE trained on the arithmetic chats, wrapped for transformers."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    # transformers (v5) loads any model_type "qwen2" checkpoint as Qwen2Tokenizer, which keeps
    # only the vocabulary and merges and rebuilds the rest; train with that same pipeline so the
    # merges fit it. Its regex makes every digit a token of its own, so arithmetic is learnable.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    # The regex splits " + 5" into " +", " ", "5"; with the spaced operators as whole tokens,
    # held-out accuracy after the warm start went from about 5-10% to 20-30%.
    tok.add_tokens(OPERATOR_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )


def _warm_example(tokenizer, row: dict, step_by_step: bool) -> tuple[list[int], int]:
    """Token ids of prompt + target, and the length of the prompt."""
    messages = [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": row["question"]},
    ]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    target = tokenizer.encode(arithmetic.format_completion(row, step_by_step) + "<|im_end|>", add_special_tokens=False)
    return prompt + target, len(prompt)


def _common_prefix_len(seqs: list[list[int]]) -> int:
    n = 0
    while all(len(s) > n for s in seqs) and len({s[n] for s in seqs}) == 1:
        n += 1
    return n


def _warm_start(
    model,
    tokenizer,
    steps: int,
    batch_size: int,
    learning_rate: float,
    warmup: int,
    weight_decay: float,
    stepwise_low: float,
    stepwise_high: float,
    seed: int,
) -> None:
    """Supervised next-token training on the completion tokens of arithmetic chats.

    Each row's target style is drawn with the seed from `stepwise_probability`.

    Every chat opens with the same system turn, about half of its tokens: that prefix runs
    once per step and its keys and values are repeated over the batch. The loss and gradients
    equal those of the full sequences (checked to float precision) for about 1.5x less work.
    """
    rows = arithmetic.make_problems(steps * batch_size, seed=seed, split="train")
    style_rng = random.Random(seed + 1)
    keys = [  # (question, step by step)
        (r["question"], style_rng.random() < stepwise_probability(r["question"], stepwise_low, stepwise_high))
        for r in rows
    ]
    encoded = {k: _warm_example(tokenizer, r, k[1]) for k, r in zip(keys, rows)}  # at most two per question
    examples = [encoded[k] for k in keys]
    n_prefix = _common_prefix_len([ids for ids, _ in examples])
    assert all(n_prefix < n_prompt for _, n_prompt in examples), "the shared prefix must end in the prompt"
    prefix = mx.array(examples[0][0][:n_prefix])[None]  # (1, P)
    suffixes = [ids[n_prefix:] for ids, _ in examples]
    # One padded length for every batch, so the compiled step traces once.
    length = max(len(s) for s in suffixes)
    tokens = mx.array([s + [tokenizer.pad_token_id] * (length - len(s)) for s in suffixes])  # (N, S)
    starts = mx.array([n_prompt - n_prefix for _, n_prompt in examples])[:, None]
    ends = mx.array([len(s) for s in suffixes])[:, None]
    # Position t predicts token t + 1: train only where that token is part of the target.
    targets_at = mx.arange(1, length)
    masks = ((targets_at >= starts) & (targets_at < ends)).astype(mx.float32)  # (N, S-1)

    def loss_fn(model, inputs, targets, mask):
        cache = make_prompt_cache(model)
        model(prefix, cache=cache)
        for layer in cache:
            layer.keys, layer.values = (
                mx.repeat(a, inputs.shape[0], axis=0) for a in (layer.keys, layer.values)
            )
        ce = nn.losses.cross_entropy(model(inputs, cache=cache), targets)  # (B, S-1)
        return (ce * mask).sum() / mask.sum()

    schedule = optim.join_schedules(
        [
            optim.linear_schedule(learning_rate / 10, learning_rate, warmup),
            optim.cosine_decay(learning_rate, steps - warmup, learning_rate / 10),
        ],
        [warmup],
    )
    optimizer = optim.AdamW(learning_rate=schedule, betas=[0.9, 0.98], weight_decay=weight_decay)
    optimizer.init(model.trainable_parameters())
    state = [model.state, optimizer.state]
    loss_and_grad = nn.value_and_grad(model, loss_fn)

    def step(inputs, targets, mask):
        loss, grads = loss_and_grad(model, inputs, targets, mask)
        optimizer.update(model, grads)
        return loss

    step = mx.compile(step, inputs=state, outputs=state)
    model.train()
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    for i in range(steps):
        idx = mx.array(order[i * batch_size : (i + 1) * batch_size])
        batch = tokens[idx]
        mx.eval(step(batch[:, :-1], batch[:, 1:], masks[idx]), state)
    model.eval()


def is_stepwise(completion: str) -> bool:
    """A two-step answer written as two worked lines (not as one line)."""
    reasoning = completion.split("</reasoning>")[0]
    return reasoning.count("\n") == 3


def fingerprint(model, tokenizer, questions: list[dict], seed: int = 0) -> dict:
    """What a build does on held-out questions: accuracy and share of worked steps,
    greedy and sampled at temperature 1 (the share over two-step questions only)."""
    from mlx_grpo.data.chat import render_prompt
    from mlx_grpo.rewards import extract_predicted_number
    from mlx_grpo.rollout.sample import generate_completions, make_rollout_sampler

    prompts = [tokenizer.encode(render_prompt(tokenizer, q["question"], DEFAULT_SYSTEM_PROMPT),
                                add_special_tokens=False) for q in questions]
    two_step = [q["answer"].count("\n") == 2 for q in questions]
    out = {}
    mx.random.seed(seed)
    for name, temperature, k in (("greedy", 0.0, 1), ("sampled", 1.0, 4)):
        rollout = generate_completions(model, tokenizer, prompts, num_generations=k, max_new_tokens=64,
                                       sampler=make_rollout_sampler(temperature, 1.0, 0, 0.0))
        rows = [(q, t, two) for q, two in zip(questions, two_step) for t in [None] * k]
        right = [extract_predicted_number(t) == arithmetic.final_answer(q)
                 for (q, _, _), t in zip(rows, rollout.texts)]
        steps = [is_stepwise(t) for (_, _, two), t in zip(rows, rollout.texts) if two]
        out[f"{name}_accuracy"] = round(sum(right) / len(right), 4)
        out[f"{name}_stepwise_share"] = round(sum(steps) / len(steps), 4)
        by_style = {True: [], False: []}
        for (_, _, two), t, r in zip(rows, rollout.texts, right):
            if two:
                by_style[is_stepwise(t)].append(r)
        for style, label in ((True, "stepwise"), (False, "one_line")):
            v = by_style[style]
            out[f"{name}_accuracy_{label}"] = round(sum(v) / len(v), 4) if v else None
    return out
