"""Bad input at scale: hundreds of malformed configs through the CLI, in-process.

Each must end with exit status 2 and one stderr line `mlx-grpo: error: ...` naming the key
(or the file, for broken TOML, or the `--set` item), with no traceback and nothing written
to the output folder. The training function is replaced by one that fails the test, so a
config that is wrongly accepted is caught instead of training.
"""

import contextlib
import dataclasses
import io
import math
import tempfile
import types
import typing
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlx_grpo import cli
from mlx_grpo.config import RULES, Config

SAMPLES = {"int": 3, "float": 2.5, "str": "x", "bool": True, "table": {"a": 1}}


class Accepted(Exception):
    """Raised in place of training: the config under test was accepted."""


@pytest.fixture(autouse=True)
def no_training(monkeypatch):
    import mlx_grpo.commands.train

    def accepted(cfg, *args, **kwargs):
        raise Accepted(cfg)

    monkeypatch.setattr(mlx_grpo.commands.train, "train", accepted)


def _fields(cls=Config, prefix=""):
    """(dotted key, type hint) of every setting, sections walked into; rewards as a whole."""
    out = []
    for name, hint in typing.get_type_hints(cls).items():
        dotted = f"{prefix}{name}"
        if dataclasses.is_dataclass(hint):
            out += _fields(hint, dotted + ".")
        else:
            out.append((dotted, hint))
    return out


FIELDS = [(k, h) for k, h in _fields() if k != "rewards"]
SECTIONS = [f.name for f in dataclasses.fields(Config) if dataclasses.is_dataclass(f.type)]


def _members(hint):
    """`float | None` -> [float]; `str | dict[str, str]` -> [str, dict[str, str]]; else [hint]."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(hint) if a is not type(None)]
    return [hint]


def _kind(hint):
    """The first member of a union (`float | None` -> float); other hints as they are."""
    return _members(hint)[0]


def _nest(dotted: str, value) -> dict:
    for part in reversed(dotted.split(".")):
        value = {part: value}
    return value


def _wrong_types(dotted, hint):
    """Values of a TOML type this key does not take."""
    members = _members(hint)
    ok = set().union(*({int: {"int"}, float: {"int", "float"}, str: {"str"}, bool: {"bool"}}.get(m, set())
                       | ({"table"} if typing.get_origin(m) is dict else set()) for m in members))
    values = [(v, dotted) for kind, v in SAMPLES.items() if kind not in ok]
    if "table" in ok:  # a wrong value in a table is named by its own key: an integer among strings,
        table = next(m for m in members if typing.get_origin(m) is dict)  # an array among scalars
        values.append(({"a": 1} if typing.get_args(table)[1] is str else {"a": [1]}, f"{dotted}.a"))
    hint = members[0]
    if typing.get_origin(hint) is list:
        elem = typing.get_args(hint)[0]
        values.append((["a", "b"] if elem is float else [1, 2], f"{dotted}[0]"))
    else:
        values.append(([1], dotted))
    return values


CANDIDATES = {
    int: [-(2**63), -5, -1, 0, 1, 3, 7, 100, 2**63],
    float: [-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 1e9],
    str: ["", "   ", "nope"],
}
LISTS = {"lora.target_modules": [[]], "training.adam_betas": [[], [0.9], [0.9, 1.0], [1.5, 0.2], [0.1, 0.2, 0.3]],
         "data.dataset": ["", "   ", {}, {"train": ""}, {"": "a.jsonl"}, {"test": " "}],
         "logging.report_to": [["tensorbord"], ["wandb", "wandb"], [""], ["TensorBoard"]]}


def _out_of_range(dotted, hint):
    check, _ = RULES[dotted]
    pool = LISTS.get(dotted) or CANDIDATES[_kind(hint)]
    bad = [v for v in pool if not check(v)]
    if _kind(hint) is float:
        bad += [math.nan, math.inf]
    return bad


# Out of range, written out by hand so that a rule missing from RULES is caught too.
KNOWN_BAD = [
    ("seed", -1), ("seed", 2**32), ("output_dir", ""), ("model.path", " "), ("model.dtype", "float64"), ("model.quantize_bits", 3),
    ("lora.rank", 0), ("lora.dropout", 1.0), ("lora.target_modules", []), ("data.dataset", ""), ("data.split", ""),
    ("data.prompt_field", ""), ("generation.num_generations", 1), ("generation.temperature", 0.0),
    ("generation.top_p", 0.0), ("grpo.beta", -0.1), ("grpo.loss_type", "ppo"), ("grpo.scale_rewards", "std"),
    ("grpo.num_iterations", 0), ("training.max_steps", 0), ("training.prompts_per_step", 0),
    ("training.learning_rate", 0.0), ("training.lr_schedule", "step"), ("training.adam_betas", [0.9]),
    ("training.max_bad_steps", -1), ("training.warmup_steps", 1.5), ("logging.log_every", 0), ("checkpoint.save_every", 0),
    ("checkpoint.keep_last", 0), ("generation.quantize_bits", 16), ("grpo.importance_sampling_correction", "token"),
    ("grpo.importance_sampling_cap", 0.0), ("grpo.importance_sampling_floor", -0.5),
]
BROKEN_TOML = [
    "[training", "seed = ", "seed = 1\nseed = 2", 'output_dir = "no end', "[training]\nmax_steps = 1_",
    "[training]\n[training]", "seed = 0x", "= 3", "[[rewards]\nname = 'x'", "seed = [1, 2",
    "[model]\npath = 'a' 'b'", "seed = 01", "lora = { enabled = true", "seed = 1 # ok\n]", "a.b = 1\na = 2",
    "[training]\nlearning_rate = 1e", "seed = tru", "data = {}\n[data]",
]
BAD_SETS = [
    "training.max_steps", "=3", "training..max_steps=3", ".seed=1", "seed.=1", "training.max_steps=[1,",
    'grpo.loss_type="a" "b"', "training.max_steps={", "model.path='x", "rewards=[{name=}]",
    "training.max_steps=1 2", "seed=1=2", "a b=1",
]


def _cases():
    """(profile text or bytes, --set items, text the error must contain)."""
    cases = []
    for dotted, hint in FIELDS:
        for value, key in _wrong_types(dotted, hint):
            cases.append((tomli_w.dumps(_nest(dotted, value)), [], f": {key} must be"))
        if dotted in RULES:
            for value in _out_of_range(dotted, hint):
                cases.append((tomli_w.dumps(_nest(dotted, value)), [], f": {dotted} must be"))
    cases += [(tomli_w.dumps(_nest(k, v)), [], f": {k} must be") for k, v in KNOWN_BAD]
    for section in SECTIONS:
        first = next(k for k, _ in FIELDS if k.startswith(section + "."))
        typo = first[:-1] if len(first.split(".")[1]) > 3 else first + "x"
        cases.append((tomli_w.dumps(_nest(typo, 1)), [], f"unknown key {typo!r}"))
        cases.append((tomli_w.dumps(_nest(f"{section}.bogus_key", 1)), [], f"unknown key '{section}.bogus_key'"))
        cases.append((f"{section} = 5\n", [], f": {section} must be a table"))
    cases += [
        ("sed = 1\n", [], "unknown key 'sed' (did you mean 'seed'?)"),
        ("[trainig]\nmax_steps = 1\n", [], "unknown section 'trainig' (did you mean 'training'?)"),
        ("rewards = 'x'\n", [], ": rewards must be an array"),
        ("rewards = []\n", [], ": rewards must be a non-empty array"),
        ("rewards = [5]\n", [], ": rewards[0] must be a table"),
        ("[[rewards]]\nweight = 1.0\n", [], ": rewards[0].name is required"),
        ("[[rewards]]\nname = 'xml_format'\nextra = 1\n", [], "unknown key 'rewards[0].extra'"),
        ("[[rewards]]\nname = 'xml_format'\nweight = 'heavy'\n", [], ": rewards[0].weight must be a number"),
        ("[[rewards]]\nname = ''\n", [], ": rewards[0].name must be a non-empty reward name"),
        (b"seed = 1\n\xff\xfe\n", [], "bad.toml: invalid TOML"),
    ]
    cases += [(text, [], "bad.toml: invalid TOML") for text in BROKEN_TOML]
    cases += [("", [item], f"--set {item}") for item in BAD_SETS]
    cases += [("", [f"{k}={v!r}".replace("'", '"')], f"--set {k}=") for k, v in
              [("training.max_steps", "ten"), ("lora.rank", 1.5), ("generation.top_p", 2.0), ("nope.key", 1)]]
    return cases


def run_cli(profile: str | bytes, sets: list[str]):
    """(exit status or 'traceback: ...', stderr, files left in the working folder)."""
    with tempfile.TemporaryDirectory() as d, contextlib.chdir(d):
        path = Path(d) / "bad.toml"
        path.write_bytes(profile if isinstance(profile, bytes) else profile.encode())
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = cli.main(["train", "--config", str(path), *[f"--set={s}" for s in sets]])
            except Accepted:
                code = "accepted"
            except BaseException as e:  # anything else would reach the user as a traceback
                code = f"traceback: {type(e).__name__}: {e}"
        left = sorted(p.name for p in Path(d).iterdir() if p.name != "bad.toml")
    return code, err.getvalue(), left


def _problem(code, err, left, fragment) -> str | None:
    if code != 2:
        return f"exit {code!r}"
    if err.count("\n") != 1 or not err.startswith("mlx-grpo: error: ") or "Traceback" in err:
        return f"not one clean line: {err!r}"
    if fragment not in err:
        return f"does not name {fragment!r}: {err!r}"
    if left:
        return f"wrote {left}"
    return None


def test_hundreds_of_malformed_configs_each_give_one_clear_line():
    cases = _cases()
    assert len(cases) >= 200
    problems = []
    for profile, sets, fragment in cases:
        problem = _problem(*run_cli(profile, sets), fragment)
        if problem:
            problems.append(f"{profile!r} {sets}: {problem}")
    assert not problems, f"{len(problems)} of {len(cases)} malformed configs: " + "\n".join(problems[:10])


FUZZ = settings(max_examples=60, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
KEYS = [k for k, _ in FIELDS]
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), max_size=12)


@FUZZ
@given(st.data())
def test_random_values_of_a_wrong_type(data):
    key, hint = data.draw(st.sampled_from(FIELDS))
    kind = _kind(hint)
    wrong = [s for t, s in [(int, st.integers(-(2**63), 2**63 - 1)), (float, st.floats(allow_nan=False)),
                            (str, TEXT), (bool, st.booleans())]
             if not (t is kind or (t is int and kind is float))]
    if typing.get_origin(kind) is list:
        wrong = [st.integers(), TEXT, st.booleans()]
    else:
        wrong.append(st.lists(st.integers(0, 9), max_size=3))
    value = data.draw(st.one_of(wrong))
    problem = _problem(*run_cli(tomli_w.dumps(_nest(key, value)), []), f": {key}")
    assert problem is None, problem


@FUZZ
@given(st.sampled_from(["", *SECTIONS]), st.from_regex(r"\A[a-z][a-z0-9_]{0,15}\Z"))
def test_random_unknown_keys(section, name):
    known = {k.rsplit(".", 1)[-1] for k in KEYS if k.startswith(section + ".") or (not section and "." not in k)}
    if name in known or (not section and name in SECTIONS + ["rewards"]):
        return
    dotted = f"{section}.{name}" if section else name
    problem = _problem(*run_cli(tomli_w.dumps(_nest(dotted, 1)), []), f"unknown key {dotted!r}")
    assert problem is None, problem


@FUZZ
@given(TEXT)
def test_random_set_items_never_give_a_traceback(item):
    code, err, left = run_cli("", [item])
    if code != "accepted":  # a random item is, rarely, a valid override
        problem = _problem(code, err, left, f"--set {item.strip()}"[:20])
        assert problem is None, problem
