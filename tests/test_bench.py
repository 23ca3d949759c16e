"""`mlx-grpo bench` runs end to end on the tiny model and reports every field (no timing asserted)."""

import json

import pytest

from mlx_grpo.cli import main

STEP_FIELDS = {"prompt_share", "shared_over_full_tokens", "total_s", "rollout_s", "rewards_s", "judge_s", "reference_s",
               "update_s", "completion_tokens", "scored_tokens", "peak_memory_gb", "update_peak_memory_gb",
               "host_s", "rollout_host_s", "reference_host_s", "update_host_s"}
LIMIT_FIELDS = {"total_s", "generation_s", "forward_backward_s", "forward_backward_plain_s",
                "forward_backward_compiled_s", "forward_backward_peak_memory_gb"}


def test_bench_writes_a_complete_report(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(["bench", "--size", "tiny", "--steps", "2", "--prompts", "1", "--generations", "2",
               "--max-new-tokens", "8", "--set", 'generation.engine="auto"', "--json", str(out)])
    assert rc == 0
    r = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert "ratio" in printed and "main thread busy" in printed  # the table was printed
    assert (r["model"], r["prompts"], r["generations"], r["max_new_tokens"]) == ("builtin:tiny", 1, 2, 8)
    assert r["lora"] is False and r["measured_steps"] == 2 and len(r["per_step"]) == 2
    assert set(r["step"]) == STEP_FIELDS and set(r["limit"]) == LIMIT_FIELDS
    for row in r["per_step"]:
        assert 2 <= row["step"]["completion_tokens"] <= 16  # 2 completions of 1..8 tokens
        assert row["step"]["scored_tokens"] == row["step"]["completion_tokens"]
        lim = row["limit"]
        assert lim["forward_backward_s"] == min(lim["forward_backward_plain_s"], lim["forward_backward_compiled_s"])
        assert lim["total_s"] == lim["generation_s"] + lim["forward_backward_s"]
    for key in ["step_over_limit", "rollout_tokens_per_s", "raw_generation_tokens_per_s", "update_tokens_per_s",
                "forward_backward_tokens_per_s", "peak_memory_gb", "update_memory_over_forward_backward"]:
        assert r[key] > 0, key
    assert r["step_over_limit"] == r["step"]["total_s"] / r["limit"]["total_s"]
    assert r["rollout_engine"] == "compiled" and "compiled against mlx-lm's BatchGenerator" in printed
    shares = r["host_share"]  # the main thread's CPU time is part of the wall time it was measured in
    assert set(shares) == {"step", "rollout", "reference", "update"} and 0 < shares["step"] <= 1.05
    assert shares["rollout"] == r["step"]["rollout_host_s"] / r["step"]["rollout_s"]
    assert set(r["machine"]) == {"matmul_float32_flops", "copy_bytes_per_s"} and min(r["machine"].values()) > 0
    for row in r["per_step"]:  # the work follows the step's tokens: tiny's counts (tests/test_roofline.py)
        tokens = row["step"]["completion_tokens"]
        a = row["achieved"]
        assert a["update_share_of_matmul"] == a["update_flops"] / row["step"]["update_s"] / r["machine"]["matmul_float32_flops"]
        assert a["rollout_flops"] > 2 * 786_432 * tokens


def test_bench_rejects_zero_steps(capsys):
    assert main(["bench", "--size", "tiny", "--steps", "0"]) == 2
    assert "--steps must be >= 1, got 0" in capsys.readouterr().err


def test_bench_prompt_tokens_lengthens_prompts_and_reports_the_prompt_share(tmp_path, capsys):
    """--prompt-tokens 96 with training.shared_prefix on: each prompt has 96 tokens, the limit
    still scores padded rows, and the shares follow from the token counts."""
    out = tmp_path / "bench.json"
    rc = main(["bench", "--size", "tiny", "--steps", "1", "--prompts", "1", "--generations", "2",
               "--max-new-tokens", "8", "--prompt-tokens", "96", "--set", "training.shared_prefix=true",
               "--json", str(out)])
    assert rc == 0 and "prompt share of tokens" in capsys.readouterr().out
    r = json.loads(out.read_text())
    assert r["shared_prefix"] is True and r["prompt_tokens"] == 96
    step = r["per_step"][0]["step"]
    c = step["completion_tokens"]  # 2 rows of 96 prompt tokens each
    assert step["prompt_share"] == pytest.approx(192 / (192 + c))
    assert step["shared_over_full_tokens"] == pytest.approx((96 + c) / (192 + c))
