"""graphcost: static cost analysis of neural-network graphs.

    from analyzer import analyze
    r = analyze("model.onnx", batch=16)
    r.totals.flops, r.memory.peak_bytes, r.to_json()
"""
from analyzer.api import analyze
from analyzer.errors import GraphcostError
from analyzer.report import Report

__all__ = ["analyze", "GraphcostError", "Report"]
__version__ = "0.1.0"
