"""What a long analysis tells the face as it goes: a ``Progress`` callback takes text (the
spinner's), and a search's counted steps are ``Step`` (text too, so that any callback reads
it; a progress bar reads its counts)."""
from __future__ import annotations

from typing import Callable

Progress = Callable[[str], None]


class Step(str):
    """A counted step of a long search (a plan's candidates) for a progress bar: the
    ``done``-th of at most ``total``, and ``what`` it is; text like any progress message to
    a callback that shows text."""
    done: int
    total: int
    what: str

    def __new__(cls, done: int, total: int, what: str) -> "Step":
        self = super().__new__(cls, f"{what} ({done} of at most {total})")
        self.done, self.total, self.what = done, total, what
        return self
