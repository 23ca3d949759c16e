"""A split's rows as training prompts: each row becomes an `Example` holding the tokenized chat
prompt, the reference answer and every other field (which the rewards receive), and
`PromptStream` walks them in a seeded order that a resumed run continues.
"""

from dataclasses import dataclass, field
import random
import sys

from mlx_grpo.data.chat import ROLES, has_chat_template, plain_prompt, prompt_messages, render_text
from mlx_grpo.data.load import DataError, load_rows


@dataclass
class Example:
    question: str  # the raw prompt field (a conversation's last user message)
    prompt: str  # the chat-rendered prompt text
    prompt_tokens: list[int]
    answer: object  # the answer field's value as loaded (text, number, list, table), or None
    columns: dict = field(default_factory=dict)  # every field but the prompt, as loaded: the rewards' keywords
    messages: list[dict] | None = None  # a conversational row's messages as rendered, system prompt included
    row: int = -1  # the row's index in its split, which reward errors name


def _field(row: dict, key: str, index: int, label: str, setting: str) -> str:
    if key not in row:
        raise DataError(
            f"{label}: row {index} has no field {key!r} (fields: {', '.join(map(str, row))}); "
            f"set {setting} to one of them"
        )
    value = row[key]
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{label}: row {index} field {key!r} must be non-empty text, got {value!r:.60}")
    return value


def _answer(row: dict, key: str, index: int, label: str):
    """The answer field's value as it is: text, a number, a list or a table reach the rewards unchanged."""
    if key not in row:
        _field(row, key, index, label, "data.answer_field")  # names the fields there are
    value = row[key]
    if value is None or (isinstance(value, str) and not value.strip()):
        raise DataError(f"{label}: row {index} field {key!r} must hold a value (text, number, list or table), "
                        f"got {value!r:.60}")
    return value


def _system(row: dict, cfg, index: int, label: str) -> str:
    """The row's system prompt: data.system_field's text when that key is set ("" = none), else data.system_prompt."""
    if not cfg.system_field:
        return cfg.system_prompt
    if cfg.system_field not in row:
        _field(row, cfg.system_field, index, label, "data.system_field")
    value = row[cfg.system_field]
    if not isinstance(value, str):
        raise DataError(f"{label}: row {index} field {cfg.system_field!r} (data.system_field) must be text, "
                        f"got {value!r:.60}")
    return value


def _messages(prompt: list, index: int, label: str, key: str) -> list[dict]:
    """A conversational prompt's messages, checked: {role, content} each, with a user message."""
    roles = ("system", *ROLES)
    for m in prompt:
        if not (isinstance(m, dict) and m.get("role") in roles and isinstance(m.get("content"), str)):
            raise DataError(f"{label}: row {index} field {key!r}: each message must be "
                            f"{{role: {' / '.join(roles)}, content: text}}, got {m!r:.60}")
    if not any(m["role"] == "user" for m in prompt):
        raise DataError(f"{label}: row {index} field {key!r}: the conversation has no user message")
    return [{"role": m["role"], "content": m["content"]} for m in prompt]


# A normalizer may fold a few characters into one (NFKC, combining marks) before tokenizing.
_CHARS_PER_NORMALIZED_CHAR = 4


def _longest_token(tokenizer) -> int:
    """The most characters one token can stand for: its longest vocabulary entry (a byte-level
    entry has a character per byte, a SentencePiece one its text; either is at least as long as
    what it decodes to)."""
    vocab = tokenizer.get_vocab()
    return max(map(len, vocab), default=1) or 1


def build_examples(rows, tokenizer, cfg, label: str = "data") -> tuple[list[Example], int]:
    """Examples for rows that fit in cfg.max_prompt_tokens, and the count skipped.

    A question longer than the most characters max_prompt_tokens tokens can stand for is skipped
    before the chat template and the tokenizer see it: tokenizing a 50 MB row took minutes and
    11 GB of memory only to find it too long.
    """
    examples, skipped = [], 0
    most_chars = cfg.max_prompt_tokens * _longest_token(tokenizer) * _CHARS_PER_NORMALIZED_CHAR
    for i, row in enumerate(rows):
        prompt, system = row.get(cfg.prompt_field), _system(row, cfg, i, label)
        conversational = isinstance(prompt, list)
        if conversational:  # the rewards see the last user message (TRL-style ones: the messages)
            messages = prompt_messages(_messages(prompt, i, label, cfg.prompt_field), system)
            question = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        else:
            question = _field(row, cfg.prompt_field, i, label, "data.prompt_field")
            messages = prompt_messages(question, system)
        answer = _answer(row, cfg.answer_field, i, label) if cfg.answer_field else None
        if len(question) > most_chars:  # the prompt holds the question, so it has more tokens than allowed
            skipped += 1
            continue
        text = render_text(tokenizer, messages, cfg.chat_template_kwargs)
        tokens = tokenizer.encode(text, add_special_tokens=False)
        if len(tokens) > cfg.max_prompt_tokens:
            skipped += 1
            continue
        fields = {k: v for k, v in row.items() if k != cfg.prompt_field}  # the prompt reaches rewards as `prompts`
        examples.append(Example(question, text, tokens, answer, fields, messages if conversational else None, i))
    return examples, skipped


def check_token_ids(examples: list[Example], rows: int, model: str, split: str | None = None) -> None:
    """Raise on a prompt token past the model's `rows` embedding rows, naming the data row (of
    `split`, where not the training data) and `model` (the setting or flag and its value): a
    tokenizer with tokens added after the model was saved gives such ids, and MLX gathers past the
    embedding (garbage logits, or a crash on a corrupted heap) rather than fail."""
    where = f" of split {split!r}" if split else ""
    for e in examples:
        top = max(e.prompt_tokens, default=0)
        if top >= rows:
            raise DataError(
                f"{model}'s tokenizer gives token id {top} in the prompt of data row {e.row}{where}, "
                f"but the model's embedding has {rows} rows (0-{rows - 1}); use the tokenizer saved with "
                "these weights"
            )


def load_examples(cfg, tokenizer, seed: int = 0, split: str | None = None,
                  setting: str = "data.split", rows: list[dict] | None = None) -> list[Example]:
    """Load, map and tokenize one split (default cfg.split); prints how many prompts were too long.

    `setting` is the key or flag that chose the split, named when the split does not exist.
    `rows`, when given (the Python API's `dataset=`), are the split's rows instead of cfg.dataset's.
    """
    split = split or cfg.split
    rows = load_rows(cfg.dataset, cfg.subset, split, seed, setting=setting) if rows is None else rows
    if not rows:
        raise DataError(f"data.dataset: split {split!r} of {_label(cfg.dataset, split)!r} has no rows")
    if not has_chat_template(tokenizer):
        print("mlx-grpo: warning: the model's tokenizer has no chat template; prompts use the plain "
              f"{plain_prompt('...')!r} format", file=sys.stderr)
    examples, skipped = build_examples(rows, tokenizer, cfg, label=_label(cfg.dataset, split))
    if skipped:
        print(f"data: skipped {skipped} of {len(rows)} prompts longer than data.max_prompt_tokens={cfg.max_prompt_tokens}")
    if not examples:
        raise DataError(f"data.max_prompt_tokens: all {len(rows)} prompts are longer than {cfg.max_prompt_tokens} tokens")
    return examples


def _label(dataset, split: str) -> str:
    """How messages name the data a split comes from: the file of a table, else the data set."""
    return dataset[split] if isinstance(dataset, dict) else dataset


class PromptStream:
    """An endless, reproducible walk over the examples, reshuffled each epoch.

    `position` counts prompts handed out, so a resumed run can continue the same walk.
    """

    def __init__(self, examples: list[Example], shuffle: bool, seed: int, position: int = 0):
        self.examples = examples
        self.shuffle = shuffle
        self.seed = seed
        self.position = position
        self._epoch, self._order = -1, []

    def _order_of(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            self._epoch, self._order = epoch, list(range(len(self.examples)))
            if self.shuffle:
                random.Random(f"{self.seed}:{epoch}").shuffle(self._order)
        return self._order

    def take(self, n: int) -> list[Example]:
        out = []
        for _ in range(n):
            epoch, offset = divmod(self.position, len(self.examples))
            out.append(self.examples[self._order_of(epoch)[offset]])
            self.position += 1
        return out
