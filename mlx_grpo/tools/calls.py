"""Tool calls in a model's text and tool results as the tokens that follow its turn.

The call format is the family's: mlx-lm's tokenizer tool parser where the model's tokenizer has
one (`tool_call_start`, `tool_call_end`, `tool_parser`), else Qwen/Hermes
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`. A tool result is appended as the
chat template renders a tool message after an assistant turn (Qwen's `<tool_response>` block in
a user turn, ChatML's `tool` turn), ending where the assistant's next turn begins; the history
before it is never re-tokenized. Pure Python, no MLX.
"""

from dataclasses import dataclass
import json

from mlx_grpo.data.chat import SYSTEM_EXTRA, has_chat_template

HERMES_START, HERMES_END = "<tool_call>", "</tool_call>"
_ASSISTANT = "MLXGRPOASSISTANTTURN"  # stands for the model's turn, to find where the template goes on


def _hermes(text: str, tools=None) -> dict:
    return json.loads(text.strip())


@dataclass(frozen=True)
class ToolFormat:
    start: str
    end: str
    parse: object  # (text between the markers, tools) -> {"name", "arguments"}

    @classmethod
    def of(cls, tokenizer) -> "ToolFormat":
        """The tokenizer's own tool-call format (mlx-lm's parser), else Hermes/Qwen JSON."""
        if getattr(tokenizer, "has_tool_calling", False) and getattr(tokenizer, "tool_parser", None):
            return cls(tokenizer.tool_call_start, tokenizer.tool_call_end, tokenizer.tool_parser)
        return cls(HERMES_START, HERMES_END, _hermes)

    def calls(self, text: str, schemas=None) -> list[dict | str]:
        """The turn's calls in order: {"name", "arguments"} each, or an error message for one that
        cannot be read (bad JSON, no name, no closing marker)."""
        out, at = [], 0
        while (begin := text.find(self.start, at)) >= 0:
            body_at = begin + len(self.start)
            close = text.find(self.end, body_at)
            if close < 0:
                out.append(f"malformed tool call: no {self.end} after {self.start}")
                break
            body, at = text[body_at:close], close + len(self.end)
            try:
                call = self.parse(body, schemas)
            except Exception as e:  # the parser's own error names what it could not read
                out.append(f"malformed tool call ({type(e).__name__}: {' '.join(str(e).split())[:200]}); "
                           f'expected {self.start}{{"name": ..., "arguments": {{...}}}}{self.end}')
                continue
            out.append(_normal(call))
        return out


def _normal(call) -> dict | str:
    if isinstance(call, list) and len(call) == 1:
        call = call[0]
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return f"malformed tool call: expected an object with a \"name\", got {json.dumps(call)[:120]}"
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):  # OpenAI's form: the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return f"malformed tool call: the arguments of {call['name']!r} are not JSON: {arguments[:120]!r}"
    return {"name": call["name"], "arguments": arguments}


def tool_turn_text(tokenizer, results: list[tuple[str, str]], ended_with_eos: bool,
                   template_kwargs: dict | None = None) -> str:
    """The text that follows a model turn which called tools: the tool messages (name, content),
    then the opening of the model's next turn. A turn that ended with its EOS token gets the
    rest; one that stopped at the call's closing marker gets the turn's end too."""
    messages = [{"role": "tool", "name": name, "content": content} for name, content in results]
    if not has_chat_template(tokenizer):
        return "".join(f"\nTool: {m['content']}" for m in messages) + "\nAssistant:"
    kwargs = {k: v for k, v in (template_kwargs or {}).items() if k != SYSTEM_EXTRA}
    try:
        text = _after_assistant(tokenizer, messages, kwargs)
    except Exception:  # a template without a tool role (Gemma 3's raises): the results as a user turn
        text = _after_assistant(tokenizer, [_as_user(messages)], kwargs)
    rest = text[text.rindex(_ASSISTANT) + len(_ASSISTANT):]
    eos = getattr(tokenizer, "eos_token", None)
    if ended_with_eos and eos and rest.startswith(eos):
        rest = rest[len(eos):]
    return rest


def _after_assistant(tokenizer, messages: list[dict], kwargs: dict) -> str:
    convo = [{"role": "user", "content": "U"}, {"role": "assistant", "content": _ASSISTANT}, *messages]
    return tokenizer.apply_chat_template(convo, add_generation_prompt=True, tokenize=False, **kwargs)


def _as_user(messages: list[dict]) -> dict:
    """Tool messages as one user message, each result in a <tool_response> block naming its tool."""
    blocks = [f'<tool_response name="{m["name"]}">\n{m["content"]}\n</tool_response>' for m in messages]
    return {"role": "user", "content": "\n".join(blocks)}

