"""graphcost: static cost analysis of neural-network graphs.

    from graphcost import analyze
    r = analyze("model.onnx", batch=16)
    r.totals.flops, r.memory.peak_bytes, r.to_json()

The subpackages are ``graphcost.analyzer`` (IR, frontends, API, CLI, rendering),
``graphcost.passes`` (the analysis passes and the cost rules) and ``graphcost.models_zoo``.
In the source tree they sit beside this folder (``analyzer/``, ``passes/``, ``models_zoo/``);
an installed graphcost holds them inside it, so no generic top-level name (``passes``) ever
lands in site-packages.
"""
import os as _os

if not _os.path.isdir(_os.path.join(_os.path.dirname(__file__), "analyzer")):
    # a source checkout (or an editable install): the subpackages are the checkout's folders
    __path__.append(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))

__all__ = ["analyze", "GraphcostError", "Report"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # Imported on first use: `import graphcost` alone loads neither onnx nor torch.
    if name == "analyze":
        from graphcost.analyzer.api import analyze
        return analyze
    if name == "GraphcostError":
        from graphcost.analyzer.errors import GraphcostError
        return GraphcostError
    if name == "Report":
        from graphcost.analyzer.report import Report
        return Report
    raise AttributeError(f"module 'graphcost' has no attribute {name!r}")
