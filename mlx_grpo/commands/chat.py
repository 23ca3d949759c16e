"""An interactive, streaming chat that keeps the conversation and its KV cache (`mlx-grpo chat`).

Each turn renders the whole conversation with the chat template, keeps the part of the KV
cache that matches it token for token (re-tokenized answers can differ from the sampled
tokens; the cache is trimmed back to where they agree) and runs the model only over the
rest. `/reset` clears the conversation, `/system TEXT` sets the system prompt and starts
over, `/quit` or Ctrl-D ends; Ctrl-C stops the answer being written, not the program.
"""

from collections.abc import Callable
import sys

from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache
from mlx_lm.utils import common_prefix_len

from mlx_grpo.commands.args import add_model_args, add_sampling_args
from mlx_grpo.commands.generate import print_piece, stream_answer
from mlx_grpo.data.chat import render_messages
from mlx_grpo.errors import ModelError
from mlx_grpo.models.vocab import check_prompt_ids

HELP = "commands: /reset (new conversation), /system TEXT, /quit; Ctrl-C stops an answer, Ctrl-D exits"


class ChatSession:
    """A conversation with one model; `cached` lists exactly the tokens the KV cache holds."""

    def __init__(self, model, tokenizer, *, system_prompt: str = "", max_tokens: int = 256, sampler=None,
                 template_kwargs: dict | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.system_prompt, self.max_tokens, self.sampler = system_prompt, max_tokens, sampler
        self.template_kwargs = template_kwargs or {}  # the run's data.chat_template_kwargs
        self.reset()

    def reset(self):
        self.messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        self.cache = make_prompt_cache(self.model)
        self.cached: list[int] = []

    def set_system(self, text: str):
        self.system_prompt = text
        self.reset()

    def _reuse_cache(self, tokens: list[int]) -> int:
        """Trim the cache to its longest prefix shared with `tokens`; returns that length."""
        keep = min(common_prefix_len(self.cached, tokens), len(tokens) - 1)  # feed >= 1 token
        if keep < len(self.cached):
            if can_trim_prompt_cache(self.cache):
                trim_prompt_cache(self.cache, len(self.cached) - keep)
            else:
                self.cache, keep = make_prompt_cache(self.model), 0
        self.cached = tokens[:keep]
        return keep

    def reply(self, text: str, on_text: Callable[[str], None] = lambda s: None) -> tuple[str, bool]:
        """The answer to `text` (streamed to on_text) and whether Ctrl-C cut it short."""
        self.messages.append({"role": "user", "content": text})
        tokens = render_messages(self.tokenizer, self.messages, self.template_kwargs)
        try:
            check_prompt_ids(self.model, tokens)
        except ModelError:
            self.messages.pop()  # the conversation goes on as if this line was not sent
            raise
        keep = self._reuse_cache(tokens)
        pieces = []
        try:
            answer = stream_answer(self.model, self.tokenizer, tokens[keep:], max_tokens=self.max_tokens,
                                   sampler=self.sampler, prompt_cache=self.cache,
                                   on_text=lambda s: (pieces.append(s), on_text(s)))
        except KeyboardInterrupt:
            # The cache may be mid-update: start it afresh, the next turn refills it.
            self.cache, self.cached = make_prompt_cache(self.model), []
            self.messages.append({"role": "assistant", "content": "".join(pieces)})
            return "".join(pieces), True
        self.messages.append({"role": "assistant", "content": answer.text})
        self._note_cached(tokens, answer)
        return answer.text, False

    def _note_cached(self, tokens: list[int], answer):
        # mlx-lm feeds each sampled token back before the next one is asked for, so the cache
        # may or may not hold the last sampled token: its offset says which.
        fed = tokens + answer.tokens
        # the first layer with an attention cache: a hybrid's convolution/SSM state has no offset
        offset = next(c.offset for c in self.cache if hasattr(c, "offset"))
        assert offset <= len(fed), f"KV cache holds {offset} tokens, more than the {len(fed)} fed"
        self.cached = fed[:offset]


def chat_loop(session: ChatSession, read: Callable[[str], str] = input, out=None):
    """Read lines until /quit or end of input; each line is a command or a user turn."""
    out = out or sys.stdout
    out.write(HELP + "\n")
    while True:
        try:
            line = read(">> ")
        except EOFError:
            out.write("\n")
            return
        except KeyboardInterrupt:
            out.write("\n(Ctrl-D or /quit exits)\n")
            continue
        command, _, rest = line.strip().partition(" ")
        if not command:
            continue
        if command == "/quit":
            return
        if command == "/reset":
            session.reset()
            out.write("(new conversation)\n")
        elif command == "/system":
            session.set_system(rest.strip())
            out.write(f"(system prompt set{'' if rest.strip() else ' to none'}; new conversation)\n")
        elif command.startswith("/"):
            out.write(f"unknown command {command}; {HELP}\n")
        else:
            try:
                _, stopped = session.reply(line.strip(), on_text=lambda s: print_piece(s, out))
            except ModelError as e:
                out.write(f"error: {e}\n")
                continue
            out.write(" [stopped]\n" if stopped else "\n")


def add_arguments(parser):
    add_model_args(parser)
    add_sampling_args(parser)


def main(args):
    import mlx.core as mx

    from mlx_grpo.models.named import load_model
    from mlx_grpo.rollout.sample import make_rollout_sampler

    loaded = load_model(args.model, args.adapter)
    mx.random.seed(args.seed)
    session = ChatSession(
        loaded.model, loaded.tokenizer, max_tokens=args.max_tokens,
        system_prompt=loaded.system_prompt if args.system is None else args.system,
        sampler=make_rollout_sampler(args.temperature, args.top_p, 0, 0.0), template_kwargs=loaded.template_kwargs,
    )
    chat_loop(session)
