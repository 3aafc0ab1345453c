"""argparse types for the commands' numbers (fleetwatch/cli.py and the parsers it builds from other
modules): each a value or an ArgumentTypeError naming the rule, and the same check for a key of the
configuration file (fleetwatch/cli.py's _file_flag applies the flag's own type)."""

from __future__ import annotations

import argparse


def _number_text(text: str) -> str:
    """The text of a number as a person writes one: int() and float() also read Python's digit
    grouping (9_108) and digits of other scripts, which no flag or config value means."""
    t = text.strip()
    if "_" in t or not t.isascii():
        raise argparse.ArgumentTypeError(f"not a plain number: {text!r}")
    return t


def positive_float(text: str) -> float:
    v = float(_number_text(text))
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def nonneg_float(text: str) -> float:
    v = float(_number_text(text))
    if not v >= 0:  # NaN too: it passes every comparison's "no", and a NaN limit refuses or lets all pass
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def positive_int(text: str) -> int:
    v = int(_number_text(text))
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def nonneg_int(text: str) -> int:
    v = int(_number_text(text))
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def port(text: str) -> int:
    v = int(_number_text(text))
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port (0-65535; 0: off), got {text}")
    return v


def year(text: str) -> int:
    v = int(_number_text(text))
    if not 1 <= v <= 9999:
        raise argparse.ArgumentTypeError(f"must be a year (1-9999), got {text}")
    return v
