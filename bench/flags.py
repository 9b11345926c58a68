"""argparse types the bench scripts share: a count that must be 1 or more (threads, rounds, repeats), so
that `--threads 0` is a usage error naming the flag, not torch's traceback or the median of no rounds."""

import argparse


def positive_int(text: str) -> int:
    """`text` as an int of 1 or more; argparse reports anything else as a usage error naming the flag."""
    value = int(text)  # not an int: argparse's "invalid positive_int value"
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not 1 or more")
    return value
