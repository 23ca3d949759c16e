"""Prompts for training: load a data set, map its fields, render chat prompts.

A data set is `builtin:arithmetic`, a Hugging Face hub id (loaded with `datasets`), a local
.jsonl/.json/.parquet/.csv file, or a table of local files by split name, as `datasets`
takes `data_files` ({train = "a.jsonl", test = "b.jsonl"}). A single local file is the split
"train" and nothing else, so held-out data is always a file of its own. Each row becomes an
`Example` holding the tokenized chat prompt and the reference answer the rewards compare against.
"""

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
import random
import sys

from mlx_grpo.config.paths import is_local_path
from mlx_grpo.data.chat import ROLES, has_chat_template, plain_prompt, prompt_messages, render_text
from mlx_grpo.errors import UserError

# The whole training pool once, and 200 of the 325 held-out questions. The rows never depend on
# the run's seed, which orders the training prompts (PromptStream), so every seed is scored on
# the same held-out questions.
BUILTIN_SIZES = {"train": 995, "test": 200}
_LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


class DataError(UserError, ValueError):
    """A data set that cannot be used as configured; the message names the row or field."""


@dataclass
class Example:
    question: str  # the raw prompt field
    prompt: str  # the chat-rendered prompt text
    prompt_tokens: list[int]
    answer: str | None
    id: int  # the row's index in its split: what a step's metrics row records of the prompts drawn


def load_rows(dataset: str | dict[str, str], subset: str = "", split: str = "train", seed: int = 0,
              setting: str = "data.split") -> list[dict]:
    """The rows of one split of a data set, as dicts.

    `dataset` is `builtin:NAME`, a hub id (the hub's splits; `subset` is its config name), a
    local file, which holds the split "train" and no other, or a table {split: local file}.
    A split the data set does not have is an error naming `setting`, the key it came from.
    """
    if isinstance(dataset, dict):
        _no_subset(subset, "a table of local files")
        if split not in dataset:
            raise DataError(f"{setting}: data.dataset has no split {split!r} (its splits: {', '.join(dataset)})")
        return _local_rows(dataset[split], f"data.dataset.{split}")
    if dataset.startswith("builtin:"):
        _no_subset(subset, dataset)
        return _builtin_rows(dataset.removeprefix("builtin:"), split, seed)
    path = Path(dataset).expanduser()
    if path.suffix.lower() in _LOCAL_FORMATS or is_local_path(dataset):
        _no_subset(subset, f"the local file {dataset!r}")
        if split != "train":
            raise DataError(
                f"{setting}: {dataset!r} is one file, which is the split 'train' alone, not {split!r}; "
                f"give data.dataset a file per split, e.g. {{train = \"{dataset}\", {split} = \"other.jsonl\"}}"
            )
        return _local_rows(dataset, "data.dataset")
    _reach_hub(dataset)
    return _load_hf(dataset, subset or None, split, label=dataset, setting=setting)


def _reach_hub(name: str) -> None:
    """Stop at once when the hub cannot be reached: `datasets` retries a lost connection for
    about 25 s before saying so. With HF_HUB_OFFLINE=1 `datasets` reads its cache, unasked."""
    from mlx_grpo.config.hub import unreachable

    if why := unreachable(name, "dataset"):
        raise DataError(f"data.dataset: cannot load {name!r} from the hub, which cannot be reached "
                        f"({why}); for a copy already in the cache set HF_HUB_OFFLINE=1")


def _builtin_rows(name: str, split: str, seed: int) -> list[dict]:
    if name != "arithmetic":
        raise DataError(f"data.dataset: unknown built-in 'builtin:{name}' (known: builtin:arithmetic)")
    if split not in BUILTIN_SIZES:
        raise DataError(f"data.split: builtin:arithmetic has splits {', '.join(BUILTIN_SIZES)}, not {split!r}")
    from mlx_grpo.data.arithmetic import make_problems

    return make_problems(BUILTIN_SIZES[split], seed=0, split=split)


def _load_hf(path, subset, split, data_files=None, label="", setting="data.split"):
    import datasets

    try:
        with _quiet_datasets(data_files is not None):
            ds = datasets.load_dataset(path, subset, split=split, data_files=data_files)
    except ValueError as e:
        if "split" in str(e).lower():
            raise DataError(f"{setting}: {label!r} has no split {split!r} ({e})") from e
        raise DataError(f"data.dataset: cannot load {label!r}: {e}") from e
    except OSError as e:  # the hub unreachable or offline, or no such data set there
        if data_files is not None:
            raise
        raise DataError(f"data.dataset: cannot load {label!r} from the hub "
                        f"({type(e).__name__}: {' '.join(str(e).split())[:300]})") from e
    return [dict(row) for row in ds]


@contextmanager
def _quiet_datasets(local: bool):
    """No 'Generating train split' bar or info lines for a local file (a hub download keeps its bars)."""
    import datasets

    if not local:
        yield
        return
    bars, verbosity = datasets.is_progress_bar_enabled(), datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        yield
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()


def _no_subset(subset: str, what: str) -> None:
    if subset:
        raise DataError(f"data.subset: {what} has no subsets (configs), got {subset!r}; set data.subset = \"\"")


def _local_rows(dataset: str, setting: str) -> list[dict]:
    """All rows of a local .jsonl/.json/.parquet/.csv file."""
    path = Path(dataset).expanduser()
    suffix = path.suffix.lower()
    if path.is_dir():
        raise DataError(f"{setting}: {dataset!r} is a folder, not a data file")
    if not path.is_file():
        raise DataError(f"{setting}: file {dataset!r} does not exist")
    if suffix not in _LOCAL_FORMATS:
        raise DataError(f"{setting}: {dataset!r} has an unknown extension; expected one of " + ", ".join(_LOCAL_FORMATS))
    if suffix != ".parquet":
        _check_text(path, suffix, f"{setting}: {dataset!r}")
    try:
        return _load_hf(_LOCAL_FORMATS[suffix], None, "train", data_files=str(path), label=dataset)
    except DataError:
        raise
    except Exception as e:  # the library's own errors (pyarrow, pandas, its DatasetGenerationError)
        cause = e.__cause__ or e
        raise DataError(f"{setting}: {dataset!r} cannot be read as {suffix[1:]}: "
                        f"{type(cause).__name__}: {' '.join(str(cause).split())[:200]}") from e


def _check_text(path: Path, suffix: str, label: str) -> None:
    """A text data file must be UTF-8 and hold rows: the library's errors name neither the line
    nor the file (an empty .jsonl is a bare StopIteration)."""
    all_lines = path.read_bytes().splitlines()
    for number, line in enumerate(all_lines, 1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{label} line {number} is not UTF-8 text (byte {line[e.start]:#04x} "
                            f"at column {e.start + 1}); save the file as UTF-8") from None
    lines = [line for line in all_lines if line.strip()]
    if not lines:
        raise DataError(f"{label} is empty (no rows)")
    if suffix == ".csv" and len(lines) == 1:
        raise DataError(f"{label} has a header line and no rows")


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
        prompt = row.get(cfg.prompt_field)
        if isinstance(prompt, list):  # conversational: the rewards see the last user message
            messages = prompt_messages(_messages(prompt, i, label, cfg.prompt_field), cfg.system_prompt)
            question = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        else:
            question = _field(row, cfg.prompt_field, i, label, "data.prompt_field")
            messages = prompt_messages(question, cfg.system_prompt)
        answer = _field(row, cfg.answer_field, i, label, "data.answer_field") if cfg.answer_field else None
        if len(question) > most_chars:  # the prompt holds the question, so it has more tokens than allowed
            skipped += 1
            continue
        text = render_text(tokenizer, messages)
        tokens = tokenizer.encode(text, add_special_tokens=False)
        if len(tokens) > cfg.max_prompt_tokens:
            skipped += 1
            continue
        examples.append(Example(question, text, tokens, answer, i))
    return examples, skipped


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
