"""generate (streamed and not), chat (KV cache kept between turns, commands, Ctrl-C, Ctrl-D)."""

import os
import pty
import select
import signal
import sys
import time

import mlx_lm
import pytest

from mlx_grpo.commands.chat import ChatSession, chat_loop
from mlx_grpo.cli import main
from mlx_grpo.commands.generate import generate_answer, stream_answer
from mlx_grpo.data.chat import conversation, render_messages, render_prompt
from mlx_grpo.data.chat import DEFAULT_SYSTEM_PROMPT
from mlx_grpo.rollout.sample import make_rollout_sampler

GREEDY = make_rollout_sampler(0.0, 1.0, 0, 0.0)
QUESTION = "What is 2 + 3?"


def _prompt_text(tokenizer, system, question):
    return tokenizer.apply_chat_template(conversation(system, question), add_generation_prompt=True, tokenize=False)


def test_generate_streams_pieces_that_add_up_to_mlx_lm_answer(tiny):
    model, tokenizer = tiny
    pieces = []
    answer = generate_answer(model, tokenizer, QUESTION, system_prompt=DEFAULT_SYSTEM_PROMPT,
                             max_tokens=40, on_text=pieces.append)
    assert len(pieces) > 3 and "".join(pieces) == answer.text
    reference = mlx_lm.generate(model, tokenizer, _prompt_text(tokenizer, DEFAULT_SYSTEM_PROMPT, QUESTION),
                                max_tokens=40)
    assert answer.text == reference and "<answer>" in answer.text
    assert answer.finish_reason == "stop" and answer.tokens[-1] in tokenizer.eos_token_ids


def test_a_tokenizer_without_a_template_gets_training_s_plain_text_in_chat_too():
    class Plain:  # no chat_template; one id per character
        def encode(self, text, add_special_tokens=True):
            return [ord(c) for c in text]

    tok = Plain()
    messages = [*conversation("Be brief.", "2 + 3?"), {"role": "assistant", "content": "5"},
                {"role": "user", "content": "and 4 + 1?"}]
    text = "Be brief.\n\nUser: 2 + 3?\nAssistant: 5\nUser: and 4 + 1?\nAssistant:"
    assert render_messages(tok, messages) == [ord(c) for c in text]
    # The first turn is exactly the prompt training renders for the question.
    assert render_messages(tok, messages[:2]) == tok.encode(render_prompt(tok, "2 + 3?", "Be brief."))


def test_generate_stops_at_max_tokens(tiny):
    model, tokenizer = tiny
    answer = generate_answer(model, tokenizer, QUESTION, system_prompt=DEFAULT_SYSTEM_PROMPT, max_tokens=5)
    assert answer.num_tokens == 5 and answer.finish_reason == "length"


@pytest.mark.parametrize("flag", [[], ["--no-stream"]])
def test_generate_command_prints_the_answer(capsys, tiny, flag):
    model, tokenizer = tiny
    expected = generate_answer(model, tokenizer, QUESTION, system_prompt=DEFAULT_SYSTEM_PROMPT, max_tokens=40)
    assert main(["generate", "--model", "builtin:tiny", "--prompt", QUESTION, "--max-tokens", "40", *flag]) == 0
    out, err = capsys.readouterr()
    assert out == expected.text + "\n"
    assert f"[{expected.num_tokens} tokens" in err and "stopped by EOS" in err


def test_chat_second_turn_reuses_the_cache_and_equals_a_fresh_run(tiny):
    model, tokenizer = tiny
    session = ChatSession(model, tokenizer, system_prompt=DEFAULT_SYSTEM_PROMPT, max_tokens=40, sampler=GREEDY)
    first, _ = session.reply(QUESTION)
    assert len(session.cached) == session.cache[0].offset
    turn_one = len(session.cached)
    kept = []
    reuse = session._reuse_cache
    session._reuse_cache = lambda tokens: kept.append(reuse(tokens)) or kept[-1]
    second, stopped = session.reply("What is 4 + 1?")
    assert not stopped
    assert kept[0] >= turn_one - 2  # only the re-encoded end of turn one, at most, is run again
    # A fresh, cache-less decode of the whole conversation gives the same greedy answer.
    tokens = render_messages(tokenizer, session.messages[:-1])
    fresh = stream_answer(model, tokenizer, tokens, max_tokens=40, sampler=GREEDY)
    assert second == fresh.text
    assert [m["role"] for m in session.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert session.messages[2]["content"] == first


def test_ctrl_c_stops_the_answer_and_the_chat_goes_on(tiny):
    model, tokenizer = tiny
    session = ChatSession(model, tokenizer, system_prompt=DEFAULT_SYSTEM_PROMPT, max_tokens=40, sampler=GREEDY)
    seen = []

    def interrupt_on_third(piece):
        seen.append(piece)
        if len(seen) == 3:
            raise KeyboardInterrupt

    partial, stopped = session.reply(QUESTION, on_text=interrupt_on_third)
    assert stopped and partial == "".join(seen)
    assert session.cached == [] and session.messages[-1] == {"role": "assistant", "content": partial}
    second, stopped = session.reply("What is 4 + 1?")
    tokens = render_messages(tokenizer, session.messages[:-1])
    assert not stopped and second == stream_answer(model, tokenizer, tokens, max_tokens=40, sampler=GREEDY).text


def test_chat_loop_commands(tiny):
    model, tokenizer = tiny
    session = ChatSession(model, tokenizer, system_prompt=DEFAULT_SYSTEM_PROMPT, max_tokens=40, sampler=GREEDY)
    lines = iter([QUESTION, "/reset", "/system Be brief.", "/nope", "/quit", "never read"])

    class Out:
        text = ""

        def write(self, s):
            self.text += s

        def flush(self):
            pass

    out = Out()
    chat_loop(session, read=lambda prompt: next(lines), out=out)
    expected = generate_answer(model, tokenizer, QUESTION, system_prompt=DEFAULT_SYSTEM_PROMPT, max_tokens=40).text
    assert expected + "\n" in out.text
    assert "(new conversation)" in out.text and "unknown command /nope" in out.text
    assert session.system_prompt == "Be brief." and session.messages == [{"role": "system", "content": "Be brief."}]
    assert next(lines) == "never read"  # /quit ended the loop


def test_chat_command_in_a_terminal_exits_on_ctrl_d(tiny):
    """The real command on a pseudo-terminal: a question, /reset, then Ctrl-D."""
    model, tokenizer = tiny
    expected = generate_answer(model, tokenizer, QUESTION, system_prompt=DEFAULT_SYSTEM_PROMPT, max_tokens=40).text
    pid, fd = pty.fork()
    if pid == 0:  # the child: the chat command, its stdin and stdout the terminal
        os.execv(sys.executable, [sys.executable, "-m", "mlx_grpo", "chat", "--model", "builtin:tiny",
                                  "--max-tokens", "40"])
    output = b""

    def read_until(marker: bytes, count: int = 1, timeout: float = 120):
        nonlocal output
        deadline = time.monotonic() + timeout
        while output.count(marker) < count and time.monotonic() < deadline:
            if select.select([fd], [], [], 1)[0]:
                try:
                    output += os.read(fd, 4096)
                except OSError:
                    break
        assert output.count(marker) >= count, output.decode(errors="replace")[-500:]

    status = None
    try:
        read_until(b">> ")
        os.write(fd, QUESTION.encode() + b"\n")
        read_until(b">> ", count=2)  # the answer is written, the next prompt shown
        os.write(fd, b"/reset\n")
        read_until(b"(new conversation)")
        os.write(fd, b"\x04")  # Ctrl-D at the prompt: end of input
        _, status = os.waitpid(pid, 0)
    finally:
        if status is None:  # it failed to answer: stop it rather than leave it running
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    assert expected.replace("\n", "\r\n").encode() in output  # the terminal shows newlines as CR LF


def test_unknown_model_folder_is_one_line_error(capsys, tmp_path):
    assert main(["generate", "--model", str(tmp_path / "missing"), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"mlx-grpo: error: --model {tmp_path / 'missing'}: no such folder"
    assert main(["generate", "--model", str(tmp_path), "--prompt", "hi"]) == 2
    assert "is not a model folder (no config.json" in capsys.readouterr().err


def test_bad_number_flag_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--model", "builtin:tiny", "--prompt", "hi", "--max-tokens", "0"])
    assert "--max-tokens: must be >= 1, got 0" in capsys.readouterr().err
