"""Rebuild the shipped `builtin:tiny` files (maintainers only) and print what the build does.

    uv run python scripts/build_tiny.py                    # rewrites mlx_grpo/builtin/tiny/
    uv run python scripts/build_tiny.py --out /tmp/tiny    # somewhere else, to compare
    uv run python scripts/build_tiny.py --set stepwise_low=0.2

The result depends on the machine (BLAS, thread count, Metal vs CPU): a build elsewhere is a
different model. Users never build it; they load the shipped files, checked against
manifest.json. The fingerprint is the build's greedy and sampled (temperature 1) accuracy on
the 200 held-out questions and its share of two-step answers written as worked steps.
"""

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import mlx_lm

from mlx_grpo.models import tiny_recipe
from mlx_grpo.models.builtin import SHIPPED, write_manifest
from mlx_grpo.data.load import load_rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(SHIPPED / "tiny"), help="folder to write (replaced)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="change one warm-start setting, e.g. steps=500 (repeatable)")
    args = parser.parse_args(argv)
    recipe = dict(tiny_recipe.WARM_START)
    for item in args.overrides:
        key, _, value = item.partition("=")
        if key not in recipe:
            parser.error(f"--set {item}: unknown warm-start setting (known: {', '.join(recipe)})")
        recipe[key] = type(recipe[key])(value)
    out = Path(args.out)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tiny_recipe.build(Path(tmp), recipe)
        write_manifest(Path(tmp))
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(tmp, out)
    print(f"built {out} in {time.perf_counter() - start:.0f} s with {json.dumps(recipe)}", file=sys.stderr)
    model, tokenizer = mlx_lm.load(str(out))
    questions = load_rows("builtin:arithmetic", split="test")
    print(json.dumps(tiny_recipe.fingerprint(model, tokenizer, questions), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
