"""Numbers with units: parsing the command line's sizes, counts, times and rates, and writing
them for people (one set of units for every renderer)."""
from __future__ import annotations

import math
import re

from ...passes.errors import GraphcostError

_NUMBER = r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*"
_SIZE = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
         "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
         "tib": 2**40}
_COUNT = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9, "t": 10**12}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_RATE = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
# A count limit (--max-flops …) of 10^30 is past every model: counts beyond 2^64 (1.8e19)
# are already labelled absurd (passes/magnitude.py). A time limit: below a year.
MAX_COUNT, MAX_SECONDS = 1e30, 365 * 24 * 3600.0


def _scaled(text: str, units: dict, unit_pattern: str) -> float | None:
    """number × unit, or None when ``text`` is not a number followed by one of ``units``."""
    m = re.fullmatch(_NUMBER + f"({unit_pattern})" + r"\s*", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in units:
        return None
    return float(m.group(1)) * units[unit]


def _bounded(value: float, text: str, what: str, bound: float, words: str) -> float:
    """``value`` if it is below ``bound``: '1e309' reads as infinity (the words inf and nan
    never match _NUMBER, the digits do), which no size, count or time is; int() of it raised
    OverflowError, and a limit of infinity checks nothing."""
    if not math.isfinite(value) or value >= bound:
        raise GraphcostError(f"{what} {text!r}: too large (below {words})")
    return value


def parse_size(text: str, what: str = "size") -> int:
    """'40GiB' -> 42949672960, '4GB' -> 4e9, '4e9' -> 4000000000; 'four' is an error; below
    2^63 bytes (8 EiB: int64, as the API's sizes)."""
    value = _scaled(text, _SIZE, "[A-Za-z]*")
    if value is None:
        raise GraphcostError(f"{what} {text!r}: expected a size such as 40GiB, 4GB or 4e9")
    if value <= 0:
        raise GraphcostError(f"{what} {text!r}: must be positive")
    return int(_bounded(value, text, what, 2 ** 63, "8 EiB, int64's bound"))


def parse_count(text: str, what: str = "count") -> float:
    """'50M' -> 5e7, '1.5G' / '1.5B' -> 1.5e9, '25557032' -> 25557032.0 (SI, case-insensitive)."""
    value = _scaled(text, _COUNT, "[A-Za-z]?")
    if value is None:
        raise GraphcostError(f"{what} {text!r}: expected a number such as 50M, 1.5G or 2e9")
    return _bounded(value, text, what, MAX_COUNT, "1e30")


def parse_time(text: str, what: str = "time") -> float:
    """'5ms' -> 0.005, '0.2s' -> 0.2, '250us' -> 0.00025 (a unit is required)."""
    value = _scaled(text, _TIME, "s|ms|us|µs|ns")
    if value is None:
        raise GraphcostError(f"{what} {text!r}: expected a time such as 5ms, 0.2s or 250us")
    return _bounded(value, text, what, MAX_SECONDS, "a year")


def parse_rate(text: str, what: str = "rate") -> float:
    """Per second: '19.5T', '1555G', '1.2e13', '19.5 TFLOP/s' -> a positive float."""
    t = text.strip()
    for unit in ("flop/s", "flops", "b/s", "/s"):
        if t.lower().endswith(unit):
            t = t[: -len(unit)]
    value = _scaled(t, _RATE, "[A-Za-z]?")
    if value is None:
        raise GraphcostError(f"{what}: {text!r} is not a rate (e.g. 19.5T, 1555G, 1.2e13)")
    if not 0 < value < float("inf"):
        raise GraphcostError(f"{what}: {text!r} must be a positive number")
    return value


def _huge(n: float) -> str | None:
    """An int past 10^18 as '3.87e+25' (exactly, from its digits: one past 2^1024 has no
    float), None otherwise; such counts are labelled absurd (passes/magnitude.py)."""
    if not isinstance(n, int) or abs(n) < 10 ** 18:
        return None
    digits = str(abs(n))
    return f"{'-' if n < 0 else ''}{digits[0]}.{digits[1:3]}e+{len(digits) - 1}"


def human(n: float, unit: str = "") -> str:
    """1234567 -> '1.23M' (SI prefixes; bytes use binary units via human_bytes)."""
    huge = _huge(n)
    if huge is not None:
        return f"{huge}{unit}"
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}{unit}"
    return f"{int(n)}{unit}"


def human_bytes(n: float) -> str:
    huge = _huge(n)
    if huge is not None:
        return f"{huge} B"
    for div, suffix in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if abs(n) >= div:
            return f"{n / div:.2f} {suffix}"
    return f"{int(n)} B"


def human_time(seconds: float) -> str:
    for div, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if seconds >= div:
            return f"{seconds / div:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns" if seconds else "0"


def axes_text(values) -> str:
    """One value per spatial axis: "435" when all agree, else "435×211"."""
    texts = [f"{v:g}" for v in values]
    return texts[0] if len(set(texts)) == 1 else "×".join(texts)
