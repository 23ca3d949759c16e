"""The TL;DR task on the shipped real data: the samples, the profile, and that the rewards
measure what they claim (references far above mismatched or copied text)."""

import hashlib
import json
import re
from pathlib import Path

import pytest
from checks import import_from

from mlx_grpo.config import load_config
from mlx_grpo.data.examples import load_examples
from mlx_grpo.data.load import load_rows
from mlx_grpo.rewards import REWARDS, RewardSet, extract_reference_number, gsm8k_correctness

REPO = Path(__file__).parent.parent
DATA = REPO / "data"
PROFILE = REPO / "configs" / "tldr.toml"


baselines = import_from("scripts", "tldr_baselines")


SPLITS = {"train": str(DATA / "tldr_train.jsonl"), "test": str(DATA / "tldr_test.jsonl")}
TLDR = "data.dataset={" + ", ".join(f'{k} = "{v}"' for k, v in SPLITS.items()) + "}"


@pytest.fixture(scope="module")
def rows():
    return baselines.load_rows(DATA / "tldr_test.jsonl")


@pytest.fixture(scope="module")
def scores(rows):
    """candidate -> reward name -> per-post scores, for the five TL;DR rewards."""
    posts, refs = [r["post"] for r in rows], [r["summary"] for r in rows]
    names = ["rouge_l", "length_band", "coverage", "faithfulness", "no_copy"]
    return {cand: {n: REWARDS[n](posts, texts, refs) for n in names}
            for cand, texts in baselines.candidates(rows).items()}


@pytest.fixture(scope="module")
def table(rows):
    return baselines.score_table(rows, {r.name: r.weight for r in load_config(PROFILE).rewards})


def mean(xs):
    return sum(xs) / len(xs)


def test_sources_lists_every_shipped_file_with_its_sha1_and_rows():
    sources = (DATA / "SOURCES.md").read_text()
    shipped = sorted(DATA.glob("*.jsonl"))
    assert {p.name for p in shipped} == {"gsm8k_train.jsonl", "gsm8k_test.jsonl", "tldr_train.jsonl", "tldr_test.jsonl",
                                         "steps_train.jsonl", "steps_test.jsonl",
                                         "sums_train.jsonl", "sums_test.jsonl"}
    for path in shipped:  # every data file shipped, with its row count, size and checksum
        row = re.search(rf"\| {path.name} \| (\d+) \| ([\d,]+) \| ([0-9a-f]{{40}}) \|", sources)
        assert row, f"{path.name} has no row in data/SOURCES.md"
        lines = path.read_bytes().splitlines()
        assert int(row[1]) == len(lines)
        assert int(row[2].replace(",", "")) == path.stat().st_size
        assert row[3] == hashlib.sha1(path.read_bytes()).hexdigest()
    for attribution in ("CC-BY-4.0", "arXiv:2009.01325", "W17-4508", "Copyright (c) 2021 OpenAI"):
        assert attribution in sources


def test_sampling_is_seeded_and_keeps_source_order():
    sample = import_from("scripts", "sample_data")
    lines = [f"{i}\n".encode() for i in range(50)]
    picked = sample.sample_lines(lines, 10, seed=0)
    assert picked == sample.sample_lines(lines, 10, seed=0) != sample.sample_lines(lines, 10, seed=1)
    assert [int(x) for x in picked] == sorted(int(x) for x in picked) and len(set(picked)) == 10


def test_tldr_rows_are_complete_text():
    for split, path in SPLITS.items():
        rows = baselines.load_rows(Path(path))
        assert len(rows) == 200, split
        for row in rows:
            assert set(row) == {"post", "summary", "title", "subreddit"}
            assert all(isinstance(v, str) and v == v.strip() and v for v in row.values())


@pytest.mark.parametrize("task, field", [("tldr", "post"), ("tldr", "title"), ("gsm8k", "question")])
def test_shipped_train_and_test_files_share_no_row(task, field):
    """The held-out file of each task holds no post, title or question of its training file
    (before, one TL;DR file served both, and a run was scored on the posts it trained on)."""
    train, test = ({json.loads(line)[field] for line in (DATA / f"{task}_{split}.jsonl").read_text().splitlines()}
                   for split in ("train", "test"))
    assert len(train) == len(test) == 200 and not train & test


def test_training_posts_give_the_baseline_order_of_the_profile_header(table):
    """The profile's weights were read off the test posts; the training posts rank the
    candidates the same way, each mean within 0.04 (as the profile's header says)."""
    train = baselines.score_table(baselines.load_rows(DATA / "tldr_train.jsonl"),
                                  {r.name: r.weight for r in load_config(PROFILE).rewards})
    for total in ("total", "total (no ref)"):
        assert sorted(train, key=lambda cand: -train[cand][total]) == ["reference", "lead-3", "other post", "whole post"]
    for cand, means in train.items():
        assert means == pytest.approx(table[cand], abs=0.04), cand


def test_reference_far_above_another_posts_summary(scores):
    """Relevance rewards: the post's own summary vs. the next post's (a fluent, on-length,
    off-topic summary), in the mean and post by post."""
    ref, other = scores["reference"], scores["other post"]
    assert mean(ref["rouge_l"]) == pytest.approx(1.0)
    for name, min_wins in [("rouge_l", 1.0), ("coverage", 0.8), ("faithfulness", 0.8)]:
        assert mean(ref[name]) >= 3 * mean(other[name]) and mean(ref[name]) - mean(other[name]) >= 0.2, name
        wins = mean([r > o for r, o in zip(ref[name], other[name])])
        assert wins >= min_wins, f"{name}: the reference wins on only {wins:.0%} of the posts"


def test_form_rewards_separate_what_they_claim(scores):
    """length_band and no_copy ignore what a summary says, so a mismatched summary scores the
    same; they are checked against what they do measure: length (the whole post) and copying
    (lead-3, a verbatim excerpt)."""
    ref = scores["reference"]
    # a rotation of the same summaries: the same multiset of lengths, the same mean exactly
    assert mean(ref["length_band"]) == mean(scores["other post"]["length_band"]) > 0.99
    assert mean(scores["whole post"]["length_band"]) < 0.05
    assert mean(ref["no_copy"]) > 0.9 and mean(scores["lead-3"]["no_copy"]) == 0.0
    assert abs(mean(ref["no_copy"]) - mean(scores["other post"]["no_copy"])) < 0.1


def test_profile_weights_rank_reference_extract_offtopic_post(table):
    for total in ("total", "total (no ref)"):
        ranked = sorted(table, key=lambda cand: -table[cand][total])
        assert ranked == ["reference", "lead-3", "other post", "whole post"], total


def test_profile_header_table_matches_the_script(table):
    header = {m[1]: [float(x) for x in m[2].split()] for m in
              re.finditer(r"^#   (reference|lead-3|other post|whole post) +([\d. |]+)$",
                          PROFILE.read_text().replace("|", " "), re.M)}
    assert len(header) == 4
    for cand, numbers in header.items():
        assert numbers == pytest.approx(list(table[cand].values()), abs=5e-4), cand


def test_script_prints_the_table(tmp_path, capsys):
    data = tmp_path / "few.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in baselines.load_rows(DATA / "tldr_test.jsonl")[:5]))
    baselines.main(["--data", str(data), "--config", str(PROFILE)])
    out = capsys.readouterr().out.splitlines()
    assert out[1] == ("| candidate | rouge_l | length_band | coverage | faithfulness | no_copy | total "
                      "| total (no ref) |")
    assert out[3].startswith("| reference | 1.000 |") and len(out) == 7
    # every lead-3 is a verbatim excerpt of its post: faithful, all copied
    assert out[4].startswith("| lead-3 |") and out[4].split(" | ")[4:6] == ["1.000", "0.000"]


def test_script_rejects_rows_without_summary(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"post": "a post", "summary": " "}) + "\n")
    with pytest.raises(SystemExit, match=r"bad.jsonl: row 0 needs a non-empty text field 'summary'"):
        baselines.load_rows(data)


def test_profile_reads_the_shipped_splits(tiny):
    cfg = load_config(PROFILE, [TLDR])
    for split in ("train", "test"):
        examples = load_examples(cfg.data, tiny[1], split=split)
        rows = baselines.load_rows(DATA / f"tldr_{split}.jsonl")
        assert len(examples) == 200  # max_prompt_tokens = 2048 keeps every post
        assert [e.question for e in examples] == [r["post"] for r in rows]
        assert [e.answer for e in examples] == [r["summary"] for r in rows]
    assert cfg.data.system_prompt in examples[0].prompt and "TL;DR" in cfg.data.system_prompt
    reward_set = RewardSet.from_config(cfg.rewards)
    total, per_name = reward_set([e.question for e in examples[:4]], [e.answer for e in examples[:4]],
                                 [e.answer for e in examples[:4]])
    assert list(per_name) == ["rouge_l", "length_band", "coverage", "faithfulness", "no_copy"]
    assert all(1.0 < t <= 3.0 for t in total)  # rouge_l 1.0 plus four 0.5-weighted scores in [0, 1]


def test_reference_free_override_gives_no_answers(tiny):
    cfg = load_config(PROFILE, [TLDR, "data.answer_field="])
    examples = load_examples(cfg.data, tiny[1])
    assert {e.answer for e in examples} == {None}
    posts = [e.question for e in examples[:3]]
    assert REWARDS["rouge_l"](posts, ["a summary"] * 3, [None] * 3) == [0.0] * 3  # a constant


@pytest.mark.parametrize("split", ["train", "test"])
def test_gsm8k_answers_all_parse_and_match(tiny, split):
    cfg = load_config(None, [f'data.dataset={{{split} = "{DATA / f"gsm8k_{split}.jsonl"}"}}', f"data.split={split}",
                             "data.max_prompt_tokens=4096"])  # every question, whatever the tokenizer
    examples = load_examples(cfg.data, tiny[1])
    assert len(examples) == 200
    numbers = [extract_reference_number(e.answer) for e in examples]
    assert None not in numbers
    completions = [f"<reasoning>\n...\n</reasoning>\n<answer>\n{n}\n</answer>" for n in numbers]
    assert gsm8k_correctness([e.question for e in examples], completions, [e.answer for e in examples]) == [1.0] * 200
    assert all(json.loads(line)["answer"].count("####") == 1
               for line in (DATA / f"gsm8k_{split}.jsonl").read_text().splitlines())


def test_readme_offline_flows_train_and_evaluate_on_different_rows():
    """Each `--set 'data.dataset={...}'` of the README and docs/, with its profile: training reads the
    train file, eval (eval.split = "test") the test file, and no prompt is in both."""
    import shlex

    readme = "\n".join(p.read_text() for p in [REPO / "README.md", *(REPO / "docs").glob("*.md")]).replace("\\\n", " ")
    flows = [shlex.split(line) for line in readme.splitlines() if "data.dataset={train=" in line]
    assert {next(w for w in f if w.endswith(".toml")) for f in flows} == {"configs/default.toml", "configs/tldr.toml"}
    for words in flows:
        profile = REPO / next(w for w in words if w.endswith(".toml"))
        sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
        cfg = load_config(profile, sets)
        d = cfg.data
        train = {r[d.prompt_field] for r in load_rows(d.dataset, d.subset, d.split)}
        test = {r[d.prompt_field] for r in load_rows(d.dataset, d.subset, cfg.eval.split)}
        assert len(train) == len(test) == 200 and not train & test, profile.name


@pytest.mark.slow  # ~25 s on a loaded 2-core machine, most of it imports and data loading
def test_one_grpo_step_with_the_profile(tmp_path, rows):
    """The profile's fields, prompt and rewards through the real loop, on the tiny model. The
    posts are cut to their first three sentences: full posts are ~1,100 tiny-tokenizer tokens,
    which makes a CPU step take a minute."""
    from mlx_grpo.commands.train import train
    from mlx_grpo.run.log import read_metrics

    data = tmp_path / "short.jsonl"
    data.write_text("".join(json.dumps({**r, "post": lead}) + "\n"
                            for r, lead in zip(rows[:4], baselines.candidates(rows[:4])["lead-3"])))
    cfg = load_config(PROFILE, [
        "model.path=builtin:tiny", "model.dtype=float32", f"data.dataset={data}",
        "training.max_steps=1", "training.prompts_per_step=2", "generation.num_generations=2",
        "generation.max_new_tokens=16", "training.micro_batch_size=0", f'output_dir="{tmp_path / "run"}"',
    ])
    train(cfg)
    (row,) = read_metrics(cfg.output_dir)
    for name in ("rouge_l", "length_band", "coverage", "faithfulness", "no_copy"):
        assert 0.0 <= row[f"rewards/{name}/mean"] <= 1.0, name
    assert row["completions/mean_length"] <= 16 and row["loss"] == row["loss"]  # finite, not NaN
