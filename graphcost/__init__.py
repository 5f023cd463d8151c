"""graphcost: static cost analysis of neural-network graphs.

    from graphcost import analyze
    r = analyze("model.onnx", batch=16)
    r.totals.flops, r.memory.peak_bytes, r.to_json()

The subpackages are ``graphcost.passes`` (the IR, errors, cost rules and passes),
``graphcost.analyzer`` (frontends, the application layer, measurements, renderers, the CLI)
and ``graphcost.models_zoo``. In the source tree they sit beside this folder (``passes/``,
``analyzer/``, ``models_zoo/``); pyproject.toml's package-dir is the one mapping, so an
installed graphcost holds them inside it and an editable install maps them to the checkout.
Inside the product every import between them is relative, which resolves the same on disk.
"""
# For the type checker, which reads the source tree: graphcost.analyzer and graphcost.passes exist
# only through pyproject's package-dir (installed, or the editable install's import hook), so
# the absolute imports below do not resolve on disk; and the names in __all__ come from
# __getattr__ (PEP 562), imported on first use. The code they import is checked where it lives.
# pyright: reportMissingImports=false, reportUnsupportedDunderAll=false
__all__ = ["analyze", "GraphcostError", "Report"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # Imported on first use: `import graphcost` alone loads neither onnx nor torch.
    if name == "analyze":
        from graphcost.analyzer.app.api import analyze
        return analyze
    if name == "GraphcostError":
        from graphcost.passes.errors import GraphcostError
        return GraphcostError
    if name == "Report":
        from graphcost.analyzer.app.report import Report
        return Report
    raise AttributeError(f"module 'graphcost' has no attribute {name!r}")
