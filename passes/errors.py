"""The one exception type the user sees. The CLI prints its message as one line, exit 2.

Messages are written in the command line's words (``--dim seq=N``);
``analyzer/app/api_wording.py`` says the same in the Python API's argument names.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable


class GraphcostError(Exception):
    """Bad input or an analysis that cannot proceed; the message says what and how to fix it."""


def did_you_mean(word: str, known: Iterable[str], template: str = "{}") -> str:
    """`` (did you mean X?)`` naming the known names closest to ``word`` (difflib), or "" when
    none is close. Case is ignored (``ResNet50`` finds ``resnet50``): a name typed from a paper
    or a README is often capitalized. Only the names about as close as the best are offered,
    so a one-letter slip gets one answer. ``template`` writes a name as the user would type it
    (``zoo:{}``, ``--{}``)."""
    by_lower: dict[str, str] = {}
    for name in known:
        by_lower.setdefault(name.lower(), name)
    key = word.lower()
    scored = sorted(((difflib.SequenceMatcher(None, key, k).ratio(), k) for k in by_lower),
                    reverse=True) or [(0.0, "")]
    # 0.5 as analyzer/app/devices.py: `--dim sequence` still finds `seq`
    close = [k for r, k in scored if r >= 0.5 and r >= scored[0][0] - 0.1][:3]
    if not close:
        return ""
    return f" (did you mean {' or '.join(template.format(by_lower[c]) for c in close)}?)"
