"""What two runs answer side by side for ``graphcost diff`` (analyzer/app/diff.py): a number
in both (``Change``), each run's fit on the device both were analyzed for, and each one's time
estimate (with a run's GPU-hours and cost at its pace) — the lines its face ends on."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .report import Report


@dataclass(frozen=True)
class Change:
    """One number in both models; ``pct`` is None when the old value is 0."""
    name: str
    old: int
    new: int

    @property
    def delta(self) -> int:
        return self.new - self.old

    @property
    def pct(self) -> float | None:
        return 100.0 * self.delta / self.old if self.old else None

    def to_dict(self) -> dict[str, Any]:
        pct = self.pct
        return {"name": self.name, "old": self.old, "new": self.new, "delta": self.delta,
                "pct": None if pct is None else round(pct, 3)}


@dataclass(frozen=True)
class FitDiff:
    """Both runs' fit on the one device both were analyzed for (needs against offers)."""
    device: str
    needs: Change
    offers: int
    per_rank: bool                  # one rank's needs (a parallel layout's or a pipeline's)

    @property
    def fits(self) -> tuple[bool, bool]:
        return self.needs.old <= self.offers, self.needs.new <= self.offers

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "needs_bytes": self.needs.to_dict(), "offers_bytes":
                self.offers, "per_rank": self.per_rank, "old_fits": self.fits[0],
                "new_fits": self.fits[1]}


@dataclass(frozen=True)
class TimeDiff:
    """Both runs' time estimates (each with its own band: estimates, not measurements)."""
    old_seconds: float
    new_seconds: float
    old_band: float | None
    new_band: float | None
    per: str                        # step | forward
    run_tokens: int | None = None   # a run's (--tokens): its GPU-hours and (--price) cost
    gpu_hours: tuple[float, float] | None = None
    cost: tuple[float, float] | None = None

    @property
    def pct(self) -> float | None:
        return 100.0 * (self.new_seconds / self.old_seconds - 1) if self.old_seconds else None

    def to_dict(self) -> dict[str, Any]:
        pct, pairs = self.pct, {"gpu_hours": self.gpu_hours, "cost": self.cost}
        return {"per": self.per, "old_seconds": self.old_seconds,
                "new_seconds": self.new_seconds, "old_band": self.old_band,
                "new_band": self.new_band, "pct": None if pct is None else round(pct, 3),
                "run_tokens": self.run_tokens,
                **{k: None if v is None else list(v) for k, v in pairs.items()}}


def fits_of(a: Report, b: Report) -> FitDiff | None:
    """Both fits, where both runs were analyzed for the same device."""
    fa, fb = (r.roofline for r in (a, b))
    if fa is None or fb is None or fa.device != fb.device or fa.fit.offers != fb.fit.offers:
        return None
    return FitDiff(fa.device, Change("needs_bytes", fa.fit.needs, fb.fit.needs),
                   fa.fit.offers, per_rank=all(r.parallel is not None or r.pipeline is not None
                                               for r in (a, b)))


def times_of(a: Report, b: Report) -> TimeDiff | None:
    ta, tb = a.time, b.time
    if ta is None or tb is None:
        return None
    per = "step" if a.training is not None and b.training is not None else "forward"
    ha, hb, ca, cb = ta.gpu_hours, tb.gpu_hours, ta.cost, tb.cost  # (--tokens, --price)
    return TimeDiff(ta.seconds, tb.seconds, ta.band, tb.band, per, run_tokens=ta.run_tokens,
                    gpu_hours=(ha, hb) if ha is not None and hb is not None else None,
                    cost=(ca, cb) if ca is not None and cb is not None else None)


@dataclass(frozen=True)
class ServingDiff:
    """Both runs' serving review (``--serve``, the same request shape and batch): the
    weights, the KV cache, how many sequences and how long a context the device holds, and
    each step's time estimate (TTFT, TPOT; None without a GPU device); ``tokens``: each
    sequence's prompt + generated tokens."""
    tokens: int
    weight_bytes: Change
    kv_bytes_per_token: Change
    kv_cache_bytes: Change
    max_concurrent_sequences: Change | None   # with a device
    max_context: Change | None
    ttft: tuple[float, float] | None
    tpot: tuple[float, float] | None
    bands: tuple[float, float] | None

    def to_dict(self) -> dict[str, Any]:
        pairs = {"ttft_seconds": self.ttft, "tpot_seconds": self.tpot, "bands": self.bands}
        return {"tokens": self.tokens, **{c.name: c.to_dict() for c in (
            self.weight_bytes, self.kv_bytes_per_token, self.kv_cache_bytes,
            self.max_concurrent_sequences, self.max_context) if c is not None},
                **{k: None if v is None else list(v) for k, v in pairs.items()}}


def serving_of(a: Report, b: Report) -> ServingDiff | None:
    """Both serving reviews side by side (None unless both runs served)."""
    sa, sb = a.serving, b.serving
    if sa is None or sb is None:
        return None

    def both(name: str) -> Change | None:
        x, y = getattr(sa, name), getattr(sb, name)
        return None if x is None or y is None else Change(name, x, y)

    ta, tb = sa.time, sb.time
    times = None if ta is None or tb is None else (
        (ta.ttft_seconds, tb.ttft_seconds), (ta.tpot_seconds, tb.tpot_seconds),
        (ta.band, tb.band))
    return ServingDiff(
        sa.prompt + sa.generate, Change("weight_bytes", sa.weight_bytes, sb.weight_bytes),
        Change("kv_bytes_per_token", sa.kv_bytes_per_token, sb.kv_bytes_per_token),
        Change("kv_cache_bytes", sa.kv_cache_bytes, sb.kv_cache_bytes),
        both("max_concurrent_sequences"), both("max_context"),
        *(times or (None, None, None)))
