"""The training console as a terminal shows it: the bar and the printed lines never share a
line, no line reaches 100 columns, an eval line follows its step's line, and a long step shows
its progress inside the bar, never a phase already over. Where the output is not a terminal
(a pipe to tee, a file), or with --no-progress or TQDM_DISABLE=1, there is no bar at all."""

import fcntl
import io
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from mlx_grpo import cli
from mlx_grpo.config import load_config
from mlx_grpo.commands.train import train
from mlx_grpo.run import console as console_mod
from mlx_grpo.run.console import Console, fit, pack, show_bar, wrap
from mlx_grpo.run.log import format_eval, format_sample, format_step, read_metrics

ROOT = Path(__file__).resolve().parent.parent
FAST = ["training.max_steps=3", "training.prompts_per_step=2", "generation.num_generations=4",
        "generation.max_new_tokens=16", "checkpoint.save_every=10", "eval.every=2", "eval.limit=4",
        "logging.log_completions=1"]


def screen(raw: str, columns: int) -> list[str]:
    """The lines a terminal `columns` wide is left showing: a carriage return goes back to the
    line's start and later text overwrites, a line longer than the terminal wraps, escape
    sequences (tqdm moves the cursor with some) are dropped."""
    raw = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw)
    lines, row, col = [], [], 0
    for ch in raw:
        if ch == "\n":
            lines.append("".join(row).rstrip())
            row, col = [], 0
        elif ch == "\r":
            col = 0
        else:
            if col == columns:  # the terminal wraps the rest onto a new line
                lines.append("".join(row).rstrip())
                row, col = [], 0
            if col < len(row):
                row[col] = ch
            else:
                row.append(ch)
            col += 1
    return lines + ["".join(row).rstrip()]


def run_in_terminal(tmp_path, columns: int, *flags: str) -> list[str]:
    """The smoke profile, 3 steps, run as a user runs it: stdout and stderr on one terminal, in
    the run's parent folder (output_dir "run", as a user names it: a path of the machine's
    temporary folder can be longer than a line, and a path is never broken)."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    sets = [x for item in [*FAST, 'output_dir="run"'] for x in ("--set", item)]
    proc = subprocess.Popen([sys.executable, "-m", "mlx_grpo", "train", "--config", str(ROOT / "configs/smoke_test.toml"),
                             *sets, *flags], cwd=tmp_path, stdin=child, stdout=child, stderr=child, close_fds=True)
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(main)
    assert proc.wait(timeout=300) == 0, b"".join(chunks).decode(errors="replace")[-3000:]
    return screen(b"".join(chunks).decode(), columns)


@pytest.mark.parametrize("columns", [80, 160])
def test_a_real_terminal_shows_whole_lines_under_100_columns(tmp_path, columns):
    lines = run_in_terminal(tmp_path, columns)
    text = "\n".join(lines)
    assert all(len(line) < min(100, columns + 1) for line in lines), text
    bars = [line for line in lines if "%|" in line]
    assert bars and all(line.startswith("grpo: ") for line in bars), text  # no text glued to a bar
    firsts = [i for i, line in enumerate(lines) if re.match(r"step \d+ \| loss", line)]
    assert [lines[i].split()[1] for i in firsts] == ["1", "2", "3"], text
    evals = [i for i, line in enumerate(lines) if line.startswith("step 2 eval | prompts 4 | accuracy ")]
    assert len(evals) == 1 and firsts[1] < evals[0] < firsts[2], text  # after its step's line
    assert any(line.startswith("--- prompt: 'What is ") for line in lines[firsts[0]:firsts[1]]), text
    assert any(line.startswith("mlx-grpo: done after step 3 of 3") for line in lines), text


def test_lines_pack_and_cut_to_the_width():
    parts = ["step 12", "loss 0.1234"] + [f"reward_function_number_{i} 0.500" for i in range(6)]
    lines = pack(parts, 60)
    assert lines[0] == "step 12 | loss 0.1234 | reward_function_number_0 0.500"
    assert lines[1] == "    reward_function_number_1 0.500"  # with the next part it would pass 60
    assert all(len(line) <= 60 for line in lines)
    assert " | ".join(line.strip() for line in lines) == " | ".join(parts)  # nothing lost
    assert fit("x" * 120, 20) == "x" * 17 + "..."
    assert fit("问" * 30, 20) == "问" * 8 + "..."  # wide characters take two columns each
    assert wrap("a " * 80, 40)[1].startswith("    a a")
    assert all(len(line) <= 40 for line in wrap("word " * 50, 40))


def test_the_formatted_lines_of_a_long_row_stay_under_100_columns():
    row = {"step": 7, "loss": 0.0123, "reward": 1.5, "kl": 0.01, "entropy": 0.3, "completions/mean_length": 200.0,
           "grad_norm": 0.5, "learning_rate": 1e-6, "step_time": 1234.5, "peak_memory_gb": 12.3,
           **{f"rewards/{name}/mean": 0.5 for name in ("gsm8k_correctness", "xml_format", "a" * 150)},
           "eval/num_prompts": 200, "eval/accuracy": 0.7, "eval/rewards/gsm8k_correctness/mean": 0.7}
    lines = format_step(row) + format_eval(row) + format_sample("q" * 500, "c\n" * 500, 1.0)
    assert all(len(line) < 100 for line in lines)
    assert format_eval(row) == ["step 7 eval | prompts 200 | accuracy 0.700 | gsm8k_correctness 0.700"]


def test_a_long_step_shows_its_progress_in_the_bar(tmp_path, capsys, monkeypatch):
    # Every step counts as long here, and every progress call redraws the bar, drawn as on a terminal.
    monkeypatch.setattr(console_mod, "on_terminal", lambda: True)
    monkeypatch.setattr(console_mod, "PROGRESS_AFTER", 0.0)
    monkeypatch.setattr(console_mod, "PROGRESS_EVERY", 0.0)
    cfg = load_config("configs/smoke_test.toml", FAST + [
        f'output_dir="{tmp_path}"', "training.max_steps=2", "training.micro_batch_size=2", "grpo.num_iterations=2"])
    train(cfg)
    err = capsys.readouterr().err
    rows = read_metrics(tmp_path)
    for row in rows:
        step = row["step"]
        sampled = re.findall(rf"step {step}: sampling ([\d,]+) tokens, (\d+)/(\d+) done", err)
        tokens = [int(t.replace(",", "")) for t, _, _ in sampled]
        assert tokens == sorted(tokens) and len(tokens) > 1  # counted up while sampling
        # the last count is every token the step sampled: 8 completions of the mean length
        assert tokens[-1] == round(row["completions/mean_length"] * 8)
        assert sampled[-1][1:] == ("8", "8")
        # 8 sequences in micro-batches of 2, twice (num_iterations): 8 forward/backward passes
        assert re.findall(rf"step {step}: update (\d+)/8 micro-batches", err) == [str(i) for i in range(9)]
    assert "step 2: evaluating" in err
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 2


def test_a_long_completion_shows_its_start_and_the_end_the_reward_read():
    completion = "<reasoning>\n9 - 5 = 4\n</reasoning>\n<answer>\n4\n</answer>"
    question_line, line = format_sample("What is 9 - 5?", completion, 1.0, 80)
    assert question_line == "--- prompt: 'What is 9 - 5?'"
    # 31 columns of lead, 18 of the start, 5 of " ... ", 26 of the end (3/5 of the 44 left): 80
    assert line == "--- completion (reward 1.000): '<reasoning>\\n9 -' ... '\\n<answer>\\n4\\n</answer>'"
    long = "Janet's ducks lay 16 eggs per day. She eats three and bakes with four. " * 6 + "<answer>\n18\n</answer>"
    # the start's repr in double quotes (it holds a '); 31 + 18 + 5 + 26 = 80, and 31 + 26 + 5 + 37 = 99
    assert format_sample("q", long, 0.5, 80)[1] == (
        "--- completion (reward 0.500): \"Janet's ducks la\" ... ' <answer>\\n18\\n</answer>'")
    assert format_sample("q", long, 0.5, 99)[1] == (
        "--- completion (reward 0.500): \"Janet's ducks lay 16 egg\" ... ' with four. <answer>\\n18\\n</answer>'")
    assert format_sample("q", completion, 1.0)[1] == "--- completion (reward 1.000): " + repr(completion)  # fits whole


def test_no_bar_where_the_output_is_not_a_terminal_or_when_turned_off(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # stdout piped (to tee, a file)
    assert not show_bar()
    monkeypatch.setattr(console_mod, "on_terminal", lambda: True)
    assert show_bar() and not show_bar(False)  # --no-progress
    for value, drawn in (("1", False), ("true", False), ("0", True), ("", True)):
        monkeypatch.setenv("TQDM_DISABLE", value)
        assert show_bar() is drawn, value
        assert Console(1, 3).has_bar is drawn


def test_a_piped_run_prints_plain_step_lines_and_no_bar(tmp_path):
    sets = [*FAST, "training.max_steps=2", f'output_dir="{tmp_path / "run"}"']
    proc = subprocess.run([sys.executable, "-m", "mlx_grpo", "train", "--config", "configs/smoke_test.toml",
                           *[x for s in sets for x in ("--set", s)]], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\r" not in proc.stdout + proc.stderr and not re.search(r"^grpo: |%\|", proc.stderr, re.M), proc.stderr
    steps = [line.split(" | ")[0] for line in proc.stdout.splitlines() if re.match(r"step \d+ \| loss", line)]
    assert steps == ["step 1", "step 2"], proc.stdout


def test_no_progress_draws_no_bar_in_a_terminal(tmp_path):
    lines = run_in_terminal(tmp_path, 80, "--no-progress")
    text = "\n".join(lines)
    assert not any("%|" in line or line.startswith("grpo:") for line in lines), text
    assert [line.split()[1] for line in lines if re.match(r"step \d+ \| loss", line)] == ["1", "2", "3"], text


@pytest.mark.parametrize("command", ["train", "eval", "sweep"])
def test_every_command_with_a_bar_takes_no_progress(command):
    parser, _ = cli.build_parser()
    required = {"train": ["--config", "c"], "eval": [], "sweep": ["--config", "c", "--vary", "grpo.beta=0"]}[command]
    assert parser.parse_args([command, *required]).progress is True
    assert parser.parse_args([command, *required, "--no-progress"]).progress is False


def test_eval_draws_its_bar_only_when_asked(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(console_mod, "on_terminal", lambda: True)  # as on a terminal
    for flags, drawn in (([], True), (["--no-progress"], False)):
        out = tmp_path / f"eval{len(flags)}.json"
        assert cli.main(["eval", "--config", "configs/smoke_test.toml", "--limit", "2", "--max-tokens", "8",
                         "--out", str(out), *flags]) == 0
        err = capsys.readouterr().err
        assert ("eval: 100%" in err) is drawn, err
        assert json.loads(out.read_text())["metrics"]["num_prompts"] == 2


def test_the_bar_never_shows_a_phase_that_is_over(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(console_mod, "time", type("Clock", (), {"monotonic": staticmethod(lambda: now[0])}))
    monkeypatch.setattr(console_mod, "on_terminal", lambda: True)
    console = Console(1, 2)
    steps = iter(console)
    shown = lambda: console.bar.postfix

    def at(t, call, *args):
        now[0] = t
        call(*args)
        return shown()

    assert next(steps) == 1  # step 1 starts at t = 0
    assert at(1.0, console.sampling, 50, 0, 8) is None  # before PROGRESS_AFTER (3 s): nothing yet
    assert at(3.2, console.sampling, 150, 2, 8) == "step 1: sampling 150 tokens, 2/8 done"
    assert at(3.4, console.sampling, 180, 5, 8) == "step 1: sampling 150 tokens, 2/8 done"  # < 0.5 s later
    assert at(3.5, console.sampling, 200, 8, 8) == "step 1: sampling 200 tokens, 8/8 done"  # the last count
    # the update begins 0.1 s later, its first micro-batch may take 18 s: it says so at once
    assert at(3.6, console.updating, 0, 4) == "step 1: update 0/4 micro-batches"
    assert at(3.7, console.updating, 1, 4) == "step 1: update 0/4 micro-batches"  # throttled again
    assert at(4.2, console.updating, 2, 4) == "step 1: update 2/4 micro-batches"
    assert at(4.3, console.updating, 4, 4) == "step 1: update 4/4 micro-batches"
    console.done(reward="0.500")
    now[0] = 10.0
    assert next(steps) == 2  # a short step: no inner progress, the last step's figures stay
    assert at(10.1, console.sampling, 200, 8, 8) == at(10.2, console.updating, 0, 4) == "reward=0.500"
    console.close()
