"""How many columns a micro-batch's prompts are padded to on the shared-prefix path (pure Python:
the memory planner counts them too).

A compiled update is traced once per shape, so prompt lengths are rounded up; a fixed multiple
wastes most on short prompts (a 40-token prompt padded to 64 ran 60% more prefix columns on
builtin:tiny). Rounding up to a multiple of a quarter of the power of two at or below the length
pads less than a quarter (less than 8 columns below 32 tokens), and leaves about four shapes per
doubling of the prompt length.
"""


def prefix_columns(n: int) -> int:
    """n prompt tokens rounded up to a multiple of max(8, a quarter of the power of two <= n)."""
    step = max(8, 1 << max(0, n.bit_length() - 3))
    return -(-n // step) * step
