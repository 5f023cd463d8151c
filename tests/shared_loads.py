"""One load for the runs of a test module that load the same zoo model the same way.

Tests of the views run the command (or analyze) several times over one model, to read its
different renderings (the default view, --details, --max-rows 0); each run traced the model
again (~2 s a training or serving trace). ``shared_loads()`` memoizes what ``run_request``
(analyzer/app/api.py: both faces come there) loads: a ``zoo:`` model under the same load
options and serving spec is loaded once, and every run still parses its arguments, runs the
passes and renders. The loaded IR is immutable (frozen dataclasses), so sharing it changes
nothing a run computes. Other models (files, modules, example inputs) load as before."""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping


@contextlib.contextmanager
def shared_loads():
    from graphcost.analyzer.app import api

    real = api.load
    cache: dict[tuple, object] = {}

    def load(model, options, example_inputs=None, progress=None, *, serve=None):
        if not (isinstance(model, str) and model.startswith("zoo:")) or example_inputs is not None:
            return real(model, options, example_inputs, progress, serve=serve)
        key = (model, _key(options), _key(serve))
        if key not in cache:
            cache[key] = real(model, options, example_inputs, progress, serve=serve)
        return cache[key]

    api.load = load
    try:
        yield cache
    finally:
        api.load = real


def _key(value) -> object:
    """``value`` as a hashable key, equal for equal options: LoadOptions holds mappings (a
    dict from the command line, a mappingproxy from the API)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value).__name__, tuple((f.name, _key(getattr(value, f.name)))
                                           for f in dataclasses.fields(value))
    if isinstance(value, Mapping):
        return tuple(sorted((repr(k), _key(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_key(v) for v in value)
    return repr(value)
