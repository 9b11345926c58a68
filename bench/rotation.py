"""The order in which a benchmark's rounds run the things they compare.

Each round starts one further along the list (a, b, c; b, c, a; c, a, b; ...), so that each goes first
equally often and load from other processes, or a warm cache left by the previous run, hits all alike.
"""


def rotated(items, round_index: int) -> list:
    """`items` in the order of round `round_index` (0-based): rotated left by that many places."""
    items = list(items)
    shift = round_index % len(items) if items else 0
    return items[shift:] + items[:shift]
