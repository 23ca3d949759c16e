"""`mlx-grpo config`: a profile as it resolves, every default filled in (`--show`), or the
reference of every key (`--reference`, which docs/configuration.md is)."""

import tomli_w

from mlx_grpo.config import config_to_dict, load_config
from mlx_grpo.config.describe import reference_markdown


def add_arguments(parser):
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--show", action="store_true",
                      help="print the resolved profile as TOML, defaults included (start a profile from it)")
    what.add_argument("--reference", action="store_true",
                      help="print every key's type, default, allowed values and meaning (docs/configuration.md)")
    parser.add_argument("--config", default=None, help="a TOML profile (default: the defaults alone)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key with a TOML value (repeatable)")


def main(args) -> str:
    text = (tomli_w.dumps(config_to_dict(load_config(args.config, args.overrides))) if args.show
            else reference_markdown())
    print(text, end="")
    return text
