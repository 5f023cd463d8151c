import gc
import os
from pathlib import Path

import pytest

# A worker keeps many traced graphs alive in its module fixtures and caches, and every full
# collection of Python's cyclic collector walks them all again: called less often (as a plan's
# search does, analyzer/app/settings_analyses.py collecting_less), cycles still collected.
gc.set_threshold(20_000, 20, 20)

# Under pytest-xdist (the README's command runs one worker per core): one intra-op thread per
# worker, so that two workers' torch kernels do not fight over the same two cores. Set before
# torch is imported; the measurements are of bytes, not of time.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Zoo exports are cached across test runs (vgg16's takes ~10 s); never in the user's home.
os.environ.setdefault("GRAPHCOST_CACHE", str(Path(__file__).resolve().parent.parent / ".cache" / "zoo"))

# --torch-range: the suite as .ci/run runs it again on the oldest and the newest torch of the
# supported range. Those runs exist for what changes between torch releases: capture, export,
# decompositions, fake tensors, the kernels PyTorch dispatches, its trackers. So they leave out
# the modules below, and run each parametrized test with its first case only, plus the cases
# marked every_torch (a case a release broke before, a module whose fixture measures every
# case at once); the main suite runs everything. .ci/run stays near its 30 minutes so (the
# CUDA builds of the range run the suite 1.5 times slower than the 2.13 CPU build).
SAME_ON_EVERY_TORCH = {
    # never through torch: ONNX files, hostile inputs, the allocator model, the renderers
    "test_bad_input", "test_caching_allocator", "test_check", "test_control_flow_bounds",
    "test_cost_rules", "test_cost_rules_breadth", "test_cuda_traces", "test_design_numbers",
    "test_devices", "test_diff", "test_first_contact", "test_fuzz", "test_gpu_workspaces",
    "test_hostile", "test_hostile_budgets", "test_html_report", "test_layers", "test_liveness",
    "test_onnx_breadth_frontend", "test_onnx_corpus", "test_onnx_frontend", "test_onnx_training",
    "test_packaging", "test_plot_png", "test_receptive_field", "test_rule_ownership",
    "test_terminal", "test_validate", "test_verify",
    # golden digests are recorded for 2.13 only (they skip elsewhere)
    "test_report_golden",
    # passes and faces over traced graphs: the traces they read are checked in the range by the
    # frontend and measurement modules (fake re-runs, training, serving, parallel on gloo)
    "test_batch_scaling", "test_checkpoint_plan", "test_cli", "test_default_view", "test_fits",
    "test_parallel", "test_serving_capacity", "test_verdict_view",
    # the time estimate over traced graphs (one attention share for every fused kernel: the
    # estimate does not follow the release's dispatch); its traces are checked as above
    "test_gpu_time", "test_published_runs",
    # the plan's search, screen and advice: analyses whose traces are checked as above
    "test_plan", "test_plan_screen", "test_serve_plan",
    # a pipeline rank's allocator replay over stage traces (test_pipeline_parallel checks them)
    "test_pipeline_reserved",
    # which loads are traced again (the traces themselves are the frontends' tests')
    "test_trace_cache",
}


def pytest_addoption(parser):
    parser.addoption("--torch-range", action="store_true",
                     help="the torch-range subset (.ci/run's oldest and newest torch): see "
                          "tests/conftest.py")


def pytest_configure(config):
    config.addinivalue_line("markers", "every_torch: a case --torch-range runs although it is "
                                       "not its test's first")
    config.addinivalue_line("markers", "same_on_every_torch: a test --torch-range leaves out "
                                       "although its module runs (a pass over traces that "
                                       "other tests check on every torch)")


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--torch-range"):
        return
    keep, seen = [], set()
    for item in items:
        module = getattr(getattr(item, "module", None), "__name__", "")
        function = (module, getattr(item, "originalname", item.name))
        first = function not in seen
        seen.add(function)
        if module.rpartition(".")[2] in SAME_ON_EVERY_TORCH or \
                item.get_closest_marker("same_on_every_torch"):
            continue
        if first or item.get_closest_marker("every_torch"):
            keep.append(item)
    kept = set(map(id, keep))
    config.hook.pytest_deselected(items=[i for i in items if id(i) not in kept])
    items[:] = keep


@pytest.fixture(autouse=True)
def _fresh_traces_when_patched(request):
    """A test that patches (monkeypatch) may change how a model traces: the graphs kept from
    earlier loads (analyzer/load/trace_cache.py) are dropped before it and after it, so that it
    traces what it patched and leaves no patched graph behind."""
    if "monkeypatch" not in request.fixturenames:
        yield
        return
    from graphcost.analyzer.load.trace_cache import forget
    forget()
    yield
    forget()
