"""One answer to one prompt, streamed as mlx-lm produces it (`mlx-grpo generate`).

The prompt is put in the model's chat template with the run's system prompt, as training
saw it; a tokenizer without a chat template gets training's plain `User:`/`Assistant:` text
(data/chat.py). Decoding is mlx-lm's `stream_generate`; each text piece goes to `on_text` the
moment it is decoded.
"""

from collections.abc import Callable
from dataclasses import dataclass
import sys

import mlx.core as mx
from mlx_lm.generate import stream_generate

from mlx_grpo.commands.args import add_model_args, add_sampling_args
from mlx_grpo.data.chat import conversation, render_messages
from mlx_grpo.models.vocab import check_prompt_ids
from mlx_grpo.rollout.sample import make_rollout_sampler


@dataclass
class Answer:
    text: str
    tokens: list[int]  # the sampled ids, the EOS included when it was sampled
    finish_reason: str  # "stop" (EOS) or "length" (max_tokens)
    tokens_per_second: float

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)


def stream_answer(model, tokenizer, prompt_tokens: list[int], *, max_tokens: int, sampler,
                  prompt_cache=None, on_text: Callable[[str], None] = lambda s: None) -> Answer:
    """Decode one answer; `prompt_cache` (already holding earlier tokens) is extended in place."""
    pieces, ids, last = [], [], None
    for last in stream_generate(model, tokenizer, prompt_tokens, max_tokens=max_tokens,
                                sampler=sampler, prompt_cache=prompt_cache):
        ids.append(last.token)  # the final response repeats no token: it carries the last one
        if last.text:
            pieces.append(last.text)
            on_text(last.text)
    return Answer("".join(pieces), ids, last.finish_reason, last.generation_tps)


def generate_answer(model, tokenizer, prompt: str, *, system_prompt: str = "", max_tokens: int = 256,
                    temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                    on_text: Callable[[str], None] = lambda s: None, template_kwargs: dict | None = None) -> Answer:
    """The model's answer to `prompt`; temperature 0 is greedy decoding; `template_kwargs` are the
    run's data.chat_template_kwargs."""
    mx.random.seed(seed)
    tokens = render_messages(tokenizer, conversation(system_prompt, prompt), template_kwargs)
    check_prompt_ids(model, tokens)
    sampler = make_rollout_sampler(temperature, top_p, 0, 0.0)
    return stream_answer(model, tokenizer, tokens, max_tokens=max_tokens, sampler=sampler, on_text=on_text)


def print_piece(text: str, out=None):
    out = out or sys.stdout
    out.write(text)
    out.flush()  # a terminal shows each piece as it comes, not when a line ends


def add_arguments(parser):
    add_model_args(parser)
    parser.add_argument("--prompt", required=True, metavar="TEXT", help="the question, sent as one user message")
    add_sampling_args(parser)
    parser.add_argument("--no-stream", dest="stream", action="store_false", help="print the answer at the end")


def main(args) -> Answer:
    from mlx_grpo.models.named import load_model

    loaded = load_model(args.model, args.adapter)
    system = loaded.system_prompt if args.system is None else args.system
    answer = generate_answer(
        loaded.model, loaded.tokenizer, args.prompt, system_prompt=system, max_tokens=args.max_tokens,
        temperature=args.temperature, top_p=args.top_p, seed=args.seed,
        on_text=print_piece if args.stream else (lambda s: None), template_kwargs=loaded.template_kwargs,
    )
    if not args.stream:
        sys.stdout.write(answer.text)
    sys.stdout.write("\n")
    print(f"[{answer.num_tokens} tokens, {answer.tokens_per_second:.1f} tokens/s, "
          f"stopped by {'EOS' if answer.finish_reason == 'stop' else 'max_tokens'}]", file=sys.stderr)
    return answer
