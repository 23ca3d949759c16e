"""The judge's model: loaded once beside the policy, frozen, on the same device; its greedy
answers to a batch of requests, and its probability of "yes" against "no" as the next token.

A request is text, sent as one user message through the judge's chat template (plain text
without one, data/chat.py). Answers are decoded with the rollout's batched generator
(rollout/sample.py), greedily; yes/no needs no decoding: one forward pass over the request and
P(yes) / (P(yes) + P(no)) of the distribution after it, where "yes" is the first token of any of
YES (and "no" of NO) that no word of the other list starts with.
"""

import mlx.core as mx

from mlx_grpo.algorithm.loss import token_logprobs
from mlx_grpo.data.chat import render_prompt
from mlx_grpo.errors import ModelError
from mlx_grpo.rollout.sample import generate_completions, make_rollout_sampler

YES = ("Yes", "yes", "YES", " Yes", " yes")
NO = ("No", "no", "NO", " No", " no")


def load_judge_model(path: str, dtype: str, setting: str):
    """(model, tokenizer) of the judge, frozen and in eval mode; a model that cannot load is one
    line naming `setting` (the key that gave the path), before any step runs."""
    from mlx_grpo.config import ModelConfig
    from mlx_grpo.models.load import load_base

    try:
        model, tokenizer, _ = load_base(ModelConfig(path=path, dtype=dtype))
    except ModelError as e:  # the loader names model.path: the judge's key is another
        raise ModelError(str(e).replace("model.path", setting, 1)) from e
    model.freeze()
    model.eval()
    return model, tokenizer


def first_tokens(tokenizer, words) -> set[int]:
    return {ids[0] for w in words if (ids := tokenizer.encode(w, add_special_tokens=False))}


class JudgeModel:
    """A frozen model that answers requests: `answers` (greedy text) and `yes_probabilities`."""

    def __init__(self, model, tokenizer, setting: str = "rewards.model"):
        self.model, self.tokenizer, self.setting = model, tokenizer, setting
        self._yes_no = None

    def encode(self, request: str) -> list[int]:
        """The request as the judge's prompt: one user message, its chat template applied."""
        return self.tokenizer.encode(render_prompt(self.tokenizer, request), add_special_tokens=False)

    def answers(self, prompts: list[list[int]], max_new_tokens: int, batch_size: int) -> list[str]:
        """The greedy answer to each prompt, `batch_size` prompts decoded at once."""
        greedy = make_rollout_sampler(0.0, 1.0, 0, 0.0)
        out = []
        for lo in range(0, len(prompts), batch_size):
            out += generate_completions(self.model, self.tokenizer, prompts[lo:lo + batch_size], num_generations=1,
                                        max_new_tokens=max_new_tokens, sampler=greedy).texts
        return out

    def yes_no_tokens(self) -> tuple[list[int], list[int]]:
        """The token ids that start a yes and a no; a tokenizer that cannot tell them apart is one line."""
        if self._yes_no is None:
            yes, no = first_tokens(self.tokenizer, YES), first_tokens(self.tokenizer, NO)
            yes, no = sorted(yes - no), sorted(no - yes)
            if not yes or not no:
                raise ModelError(f"{self.setting}: the judge's tokenizer starts 'yes' and 'no' with the same "
                                 "token; use parse = \"number\"")
            self._yes_no = yes, no
        return self._yes_no

    def yes_probabilities(self, prompts: list[list[int]], batch_size: int) -> list[float | None]:
        """P(yes) / (P(yes) + P(no)) of the next token after each prompt; None when both are 0."""
        yes, no = self.yes_no_tokens()
        out = []
        for lo in range(0, len(prompts), batch_size):
            chunk = prompts[lo:lo + batch_size]
            width = max(len(p) for p in chunk)
            inputs = mx.array([p + [0] * (width - len(p)) for p in chunk])  # right-padded: causal, no mask needed
            positions = mx.array([[len(p) - 1] * (len(yes) + len(no)) for p in chunk])  # (B, K)
            targets = mx.array([yes + no] * len(chunk))  # (B, K)
            probs = mx.exp(token_logprobs(self.model, inputs, positions, targets))  # (B, K)
            p_yes, p_no = probs[:, :len(yes)].sum(axis=1), probs[:, len(yes):].sum(axis=1)
            mx.eval(p_yes, p_no)
            for y, n in zip(p_yes.tolist(), p_no.tolist()):
                out.append(y / (y + n) if y + n > 0 else None)
        return out
