"""A judge reward: a local model that scores completions (`[[rewards]] name = "judge"`): its
model (model.py) and the reward around it (reward.py). `make_judge` builds one from its
[[rewards]] entry."""

from mlx_grpo.config.sections import JUDGE_DEFAULTS
from mlx_grpo.judge.model import JudgeModel, load_judge_model
from mlx_grpo.judge.reward import TEMPLATES, JudgeReward, rank_scores


def make_judge(entry, dtype: str, group_size: int, setting: str, warn=print) -> JudgeReward:
    """The judge of a [[rewards]] entry, its model loaded now (a model that cannot load stops here);
    keys it leaves unset take JUDGE_DEFAULTS."""
    model, tokenizer = load_judge_model(entry.model, dtype, f"{setting}.model")
    keys = {k: d if getattr(entry, k, None) is None else getattr(entry, k) for k, d in JUDGE_DEFAULTS.items()}
    return JudgeReward(JudgeModel(model, tokenizer, f"{setting}.parse"), group_size=group_size, warn=warn,
                       setting=setting, **keys)
