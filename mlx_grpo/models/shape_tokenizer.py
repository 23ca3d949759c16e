"""The tokenizer of a `shape:NAME` model: a byte-level BPE of exactly the config's vocabulary
size, made here in about a second, with the family's special tokens and chat format.

No text is learned from: the vocabulary is the 256 byte symbols, then merges of byte pairs
(then of pairs and a byte) in a fixed order until every id is taken, with the special tokens at
their ids. Every id the model can sample decodes to text, and a chat renders to the same
special-token ids as the published tokenizer where those ids are known (shapes_catalog.py).

The chat templates keep each family's turn format (system, user and assistant turns, the
generation prompt, Gemma's system text folded into the first user turn), not its tool-calling
parts or default system prompts. `qwen3` is Qwen3's thinking format: `chat_template_kwargs =
{enable_thinking = false}` (data.chat_template_kwargs) closes an empty `<think>` block in the
prompt, as Qwen3's own template does; earlier answers lose their `<think>` part.
"""

from pathlib import Path

_CHATML_TURNS = (
    "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}"
)
CHAT_TEMPLATES = {
    "chatml": _CHATML_TURNS,
    "lfm2": "{{ '<|startoftext|>' }}" + _CHATML_TURNS,
    "qwen3": (
        "{%- for m in messages %}{%- set content = m['content'] %}"
        "{%- if m['role'] == 'assistant' %}{%- set content = content.split('</think>')[-1].lstrip('\n') %}{%- endif %}"
        "{{ '<|im_start|>' + m['role'] + '\n' + content + '<|im_end|>\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
        "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{%- endif %}"
        "{%- endif %}"
    ),
    "llama3": (
        "{{ '<|begin_of_text|>' }}{%- for m in messages %}"
        "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}"
        "{%- endfor %}{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
    ),
    "gemma": (
        "{{ '<bos>' }}{%- if messages[0]['role'] == 'system' %}{%- set first = messages[0]['content'] + '\n\n' %}"
        "{%- set turns = messages[1:] %}{%- else %}{%- set first = '' %}{%- set turns = messages %}{%- endif %}"
        "{%- for m in turns %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n'"
        " + (first if loop.first else '') + m['content'] | trim + '<end_of_turn>\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{%- endif %}"
    ),
}
# The special tokens each template writes, beyond those a family's catalog entry places.
TEMPLATE_TOKENS = {
    "chatml": ["<|im_start|>", "<|im_end|>"],
    "lfm2": ["<|startoftext|>", "<|im_start|>", "<|im_end|>"],
    "qwen3": ["<|im_start|>", "<|im_end|>", "<think>", "</think>"],
    "llama3": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    "gemma": ["<bos>", "<start_of_turn>", "<end_of_turn>"],
}


def _merge_pairs(alphabet: list[str]):
    """(left, right) merges in a fixed order: every byte pair, then a pair and a byte."""
    for a in alphabet:
        for b in alphabet:
            yield a, b
    for a in alphabet:
        for b in alphabet:
            for c in alphabet:
                yield a + b, c


def make_tokenizer(vocab_size: int, specials: dict[int, str], eos: str, pad: str | None, chat: str):
    """A transformers fast tokenizer with exactly `vocab_size` ids; `specials` (id -> token)
    must hold every token the `chat` template writes."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    missing = set(TEMPLATE_TOKENS[chat]) - set(specials.values())
    assert not missing, f"chat format {chat} needs special tokens {sorted(missing)}"
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    free = iter(i for i in range(vocab_size) if i not in specials)
    vocab = {symbol: next(free) for symbol in alphabet}
    merges, pairs = [], _merge_pairs(alphabet)
    for _ in range(vocab_size - len(specials) - len(alphabet)):
        a, b = next(pairs)
        vocab[a + b] = next(free)
        merges.append((a, b))
    vocab.update({token: i for i, token in specials.items()})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for _, t in sorted(specials.items())])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=pad,
                                   chat_template=CHAT_TEMPLATES[chat])


def write_tokenizer(folder: Path, vocab_size: int, specials: dict[int, str], eos: str, pad: str | None,
                    chat: str) -> None:
    """tokenizer.json and tokenizer_config.json (holding the chat template) in `folder`."""
    tokenizer = make_tokenizer(vocab_size, specials, eos, pad, chat)
    tokenizer.save_pretrained(folder, save_jinja_files=False)
