"""The built-in models `builtin:tiny` and `builtin:small`, built locally so that everything runs offline.

It owns the recipe of each model (tokenizer, Qwen2 architecture, and for tiny a short
supervised warm start on `builtin:arithmetic`), and the cache of built folders under
$MLX_GRPO_CACHE (default ~/.cache/mlx-grpo). A folder is named after a hash of the recipe
and of this code, so any change rebuilds; it is built aside and renamed into place, so a
killed build leaves no half folder and concurrent builders agree on the winner's folder.
"""

import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx_lm.models import qwen2
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_tokenizer, save_config, save_model

from mlx_grpo import arithmetic
from mlx_grpo.prompts import DEFAULT_SYSTEM_PROMPT
from mlx_grpo.rng import capture_rng, restore_rng

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
OPERATOR_TOKENS = [" + ", " - ", " = "]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_ARCH = {
    "model_type": "qwen2",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}
# Parameters, roughly 4 layers x 12 * hidden^2 (attention 3h^2 with 2 of 4 kv heads, MLP 9h^2);
# tiny: 4 x 12 x 128^2 = 0.8M plus the embedding; small: 8 x 12 x 512^2 = 25M.
RECIPES = {
    "tiny": {
        "arch": {**_ARCH, "hidden_size": 128, "num_hidden_layers": 4, "intermediate_size": 384},
        # Tuned so that sampling at temperature 1.0 keeps the format and gets about a third of
        # held-out answers right: learnable by RL, with room to improve. Half the targets write
        # a two-step question as one line, which the model gets wrong more often than the
        # worked steps; GRPO then has a behaviour to select that carries over to held-out
        # questions (the stepwise share rises from about half). Small batches matter: the model
        # learns to copy the operands after about 100 steps at batch 8; at 32 not after 300.
        "warm_start": {
            "steps": 1000,
            "batch_size": 8,
            "learning_rate": 3e-3,
            "warmup": 30,
            "weight_decay": 0.5,
            "one_line": 0.5,
            "seed": 0,
        },
    },
    "small": {
        "arch": {
            **_ARCH,
            "hidden_size": 512,
            "num_hidden_layers": 8,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "intermediate_size": 1536,
        },
        "warm_start": None,  # random init: used for speed benchmarks only
    },
}
TOKENIZER_VOCAB_SIZE = 1024  # a ceiling: the small corpus runs out of merges at about 320 tokens


def cache_root() -> Path:
    return Path(os.environ.get("MLX_GRPO_CACHE", Path.home() / ".cache" / "mlx-grpo"))


def _recipe_hash(name: str) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([name, RECIPES[name], DEFAULT_SYSTEM_PROMPT, CHAT_TEMPLATE]).encode())
    for module_file in (__file__, arithmetic.__file__):
        h.update(Path(module_file).read_bytes())
    return h.hexdigest()[:12]


def builtin_model_path(name: str) -> Path:
    """The local folder of built-in model `name`, building it on first use."""
    if name not in RECIPES:
        raise ValueError(f"unknown built-in model {name!r}; known: {', '.join(RECIPES)}")
    path = cache_root() / f"{name}-{_recipe_hash(name)}"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    # The build seeds and draws; a run that builds the model on first use must sample
    # exactly what the same run samples with the model cached.
    rng = capture_rng()
    try:
        _build(name, tmp)
        os.rename(tmp, path)
        print(f"built builtin:{name} in {time.perf_counter() - start:.1f}s: {path}", file=sys.stderr)
    except OSError:
        if not path.exists():
            raise
        # Another process renamed its build into place first; its folder is as good as ours.
    finally:
        restore_rng(rng)
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _build(name: str, path: Path) -> None:
    recipe = RECIPES[name]
    tokenizer = _train_tokenizer()
    tokenizer.save_pretrained(path, save_jinja_files=False)  # the template stays in tokenizer_config.json
    config = {
        **recipe["arch"],
        "vocab_size": len(tokenizer),
        "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
        "pad_token_id": tokenizer.pad_token_id,
    }
    save_config(dict(config), path / "config.json")
    mx.random.seed(0)
    model = qwen2.Model(qwen2.ModelArgs.from_dict(config))
    if recipe["warm_start"] is not None:
        # Train on the tokenizer exactly as mlx_lm.load will give it back.
        _warm_start(model, load_tokenizer(path), **recipe["warm_start"])
    mx.eval(model.parameters())
    save_model(path, model)


def _tokenizer_corpus() -> list[str]:
    """The chat text the model sees, cut at the special tokens as encoding will cut it."""
    corpus = []
    for row in arithmetic.make_problems(1000, seed=0, split="train"):
        corpus += [f"system\n{DEFAULT_SYSTEM_PROMPT}", "\n", f"user\n{row['question']}", "\n"]
        corpus += [f"assistant\n{arithmetic.format_completion(row)}", "\n"]
    return corpus


def _train_tokenizer():
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
    one_line: float,
    seed: int,
) -> None:
    """Supervised next-token training on the completion tokens of arithmetic chats.

    A share `one_line` of the rows, drawn with the seed, target the one-line style of
    `arithmetic.format_completion`; the rest target the worked steps.

    Every chat opens with the same system turn, about half of its tokens: that prefix runs
    once per step and its keys and values are repeated over the batch. The loss and gradients
    equal those of the full sequences (checked to float precision) for about 1.5x less work.
    """
    rows = arithmetic.make_problems(steps * batch_size, seed=seed, split="train")
    style_rng = random.Random(seed + 1)
    keys = [(r["question"], style_rng.random() >= one_line) for r in rows]  # (question, step by step)
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
