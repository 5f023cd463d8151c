"""A zoo or timm model loaded again the same way in one process is not traced again
(analyzer/load/trace_cache.py); anything else is, every time."""
from __future__ import annotations

import pytest
import torch
from graphcost.analyzer.load import loading, trace_cache

from graphcost import analyze


@pytest.fixture
def traces(monkeypatch):
    """The models torch_graph traced during the test, by name."""
    seen: list[str] = []
    real = loading.torch_graph

    def counted(r, *args, **kwargs):
        seen.append(r.name)
        return real(r, *args, **kwargs)
    monkeypatch.setattr(loading, "torch_graph", counted)
    return seen


def test_a_zoo_model_loaded_the_same_way_is_traced_once(traces):
    first = analyze("zoo:mlp", batch=4, train=True, optimizer="adam", what_if=False)
    again = analyze("zoo:mlp", batch=4, train=True, optimizer="sgd", what_if=False)
    assert traces == ["zoo:mlp"]
    # the same graph, the passes run again on it: sgd keeps no state, adam two moments
    assert again.totals == first.totals
    assert again.training.optimizer_state_bytes == 0 < first.training.optimizer_state_bytes
    analyze("zoo:mlp", batch=8, train=True, optimizer="adam", what_if=False)  # another batch
    assert traces == ["zoo:mlp", "zoo:mlp"]


def test_a_serving_review_of_a_zoo_model_is_traced_once(monkeypatch):
    seen = []
    real = loading.load_serving

    def counted(model, *args, **kwargs):
        seen.append((model, kwargs["batch"]))
        return real(model, *args, **kwargs)
    monkeypatch.setattr(loading, "load_serving", counted)
    serve = {"prompt": 32, "generate": 8}
    a = analyze("zoo:llama_tiny", batch=2, serve=serve, device="h100-sxm")
    # (another device's attention kernels are another trace: the same device, no what-ifs)
    b = analyze("zoo:llama_tiny", batch=2, serve=serve, device="h100-sxm", what_if=False)
    assert seen == [("zoo:llama_tiny", 2)]
    assert a.serving.kv_cache_bytes == b.serving.kv_cache_bytes    # (the same traces)
    analyze("zoo:llama_tiny", batch=2, serve={**serve, "generate": 16}, device="h100-sxm")
    assert len(seen) == 2                                            # another cache length


def test_a_module_object_is_traced_every_time(traces):
    net = torch.nn.Sequential(torch.nn.Linear(8, 8))
    for _ in range(2):
        analyze(net, (torch.zeros(2, 8),), train=True, optimizer="sgd", what_if=False)
    assert len(traces) == 2


def test_the_cache_keeps_the_last_few(traces):
    for batch in range(1, trace_cache.KEPT + 2):
        analyze("zoo:mlp", batch=batch, train=True, optimizer="sgd", what_if=False)
    analyze("zoo:mlp", batch=trace_cache.KEPT + 1, train=True, optimizer="sgd", what_if=False)
    assert len(traces) == trace_cache.KEPT + 1       # the newest kept
    analyze("zoo:mlp", batch=1, train=True, optimizer="sgd", what_if=False)
    assert len(traces) == trace_cache.KEPT + 2       # the oldest dropped
