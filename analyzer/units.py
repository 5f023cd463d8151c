"""Parsing sizes given on the command line."""
from __future__ import annotations

import re

from analyzer.errors import GraphcostError

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}


def parse_size(text: str, what: str = "size") -> int:
    """'40GiB' -> 42949672960, '4GB' -> 4e9, '4e9' -> 4000000000; 'four' is an error."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise GraphcostError(f"{what} {text!r}: expected a size such as 40GiB, 4GB or 4e9")
    value = float(m.group(1)) * _UNITS[unit]
    if value <= 0:
        raise GraphcostError(f"{what} {text!r}: must be positive")
    return int(value)


_COUNT = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9, "t": 10**12}


def parse_count(text: str, what: str = "count") -> float:
    """'50M' -> 5e7, '1.5G' / '1.5B' -> 1.5e9, '25557032' -> 25557032.0 (SI, case-insensitive)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]?)\s*", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _COUNT:
        raise GraphcostError(f"{what} {text!r}: expected a number such as 50M, 1.5G or 2e9")
    value = float(m.group(1)) * _COUNT[unit]
    if value < 0:
        raise GraphcostError(f"{what} {text!r}: must not be negative")
    return value


_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_time(text: str, what: str = "time") -> float:
    """'5ms' -> 0.005, '0.2s' -> 0.2, '250us' -> 0.00025 (a unit is required)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(s|ms|us|µs|ns)\s*", text)
    if m is None:
        raise GraphcostError(f"{what} {text!r}: expected a time such as 5ms, 0.2s or 250us")
    return float(m.group(1)) * _TIME[m.group(2)]
