"""Which token ids a model can take: its embedding's rows against what its tokenizer gives.

A tokenizer with tokens added after the weights were saved gives ids past the embedding, and MLX
gathers past it (garbage logits, or a crash on a corrupted heap) rather than fail, so text is
checked here where it becomes the model's input: the data's prompts when a run starts
(data/examples.py), any text at all when tools or an environment add text mid-run, and each
prompt of `generate` and `chat`.
"""

import mlx.nn as nn

from mlx_grpo.errors import ModelError

ADVICE = "use the tokenizer saved with these weights"


def embedding_rows(model) -> int | None:
    """How many token ids the model embeds: its largest embedding's rows (a vision tower's position
    table is smaller than any vocabulary), None where it has none."""
    kinds = (nn.Embedding, nn.QuantizedEmbedding)
    return max((m.weight.shape[0] for _, m in model.named_modules() if isinstance(m, kinds)), default=None)


def check_tokenizer_fits(rows: int, tokenizer, name: str, why: str) -> None:
    """Raise when `tokenizer` has any id past the model's `rows` embedding rows (`why`: what text
    it may encode)."""
    top = max(tokenizer.get_vocab().values())
    if top >= rows:
        raise ModelError(f"{name}'s tokenizer has token ids up to {top}, but the model's embedding has {rows} rows "
                         f"(0-{rows - 1}), and {why} could encode to one; {ADVICE}")


def check_prompt_ids(model, ids: list[int]) -> None:
    """Raise when a prompt has an id the model cannot embed."""
    rows, top = embedding_rows(model), max(ids, default=0)
    if rows is not None and top >= rows:
        raise ModelError(f"the prompt encodes to token id {top}, but the model's embedding has {rows} rows "
                         f"(0-{rows - 1}): its tokenizer has tokens these weights lack; {ADVICE}")
