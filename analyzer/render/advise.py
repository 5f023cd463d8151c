"""``--advise``'s face (analyzer/app/advise.py): the step as it is, then the three changes
that save most, each with its memory and throughput beside the step's. JSON: every change
tried."""
from __future__ import annotations

import json
from typing import Callable

from ...passes.errors import opt
from ..app.advise import Advice, Change, Outcome
from ..app.units import human_bytes

Words = Callable[[str], str]   # a text naming options, as the face spells them


def advice_lines(model: str, advice: Advice, word: Words) -> list[str]:
    """The advice, its option names as ``word`` spells them."""
    listed = word(f"{opt('format', value='json')} lists all")
    now = advice.now
    fit = "fits" if now.fits else "does NOT fit"
    band = f" ± {now.band:.0%}" if now.band is not None else ""
    out = [f"advise: {model} — what saves most on this step",
           f"now     {human_bytes(now.needs)} of {human_bytes(now.offers)} per GPU ({fit});",
           f"        {_rate(now)} (estimate{band})", ""]
    if not advice.best:
        return out + [f"none of the {len(advice.tried)} single changes tried saves memory "
                      f"or time ({listed})"]
    out.append(f"the {len(advice.best)} that save most of {len(advice.tried)} tried "
               f"(estimates; {listed}):")
    for c in advice.best:
        assert c.outcome is not None
        out += [f"  {word(c.words)}", f"      {_effect(now, c.outcome)}"]
    return out


def _rate(o: Outcome) -> str:
    if o.tokens_per_second:
        return f"{o.tokens_per_second:,.0f} tokens/s per GPU"
    x = o.samples_per_second
    return f"{x:,.0f} samples/s" if x >= 100 else f"{x:.3g} samples/s"


def _effect(now: Outcome, o: Outcome) -> str:
    saved = now.needs - o.needs
    memory = ("memory unchanged" if saved == 0 else f"saves {human_bytes(saved)}" if saved > 0
              else f"costs {human_bytes(-saved)}") \
        + f" ({human_bytes(o.needs)}{'' if o.fits else ', over the device'})"
    speed = o.samples_per_second / now.samples_per_second - 1 if now.samples_per_second else 0
    return f"{memory}; throughput {speed:+.0%} ({_rate(o)})"


def advice_json(model: str, advice: Advice, word: Words) -> str:
    def change(c: Change) -> dict:
        return {"change": word(c.words), "arguments": dict(c.kwargs), "error": c.error or None,
                "outcome": None if c.outcome is None else outcome(c.outcome)}

    def outcome(o: Outcome) -> dict:
        return {"needs_bytes": o.needs, "offers_bytes": o.offers, "fits": o.fits,
                "samples_per_second": o.samples_per_second,
                "tokens_per_second": o.tokens_per_second, "band": o.band}

    return json.dumps({"schema_version": 1, "kind": "advice", "model": model,
                       "now": outcome(advice.now), "best": [word(c.words) for c in advice.best],
                       "tried": [change(c) for c in advice.tried]}, indent=1) + "\n"
