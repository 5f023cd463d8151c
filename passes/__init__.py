"""Analysis passes: pure functions from an ``passes.ir.Graph`` to results keyed by node/value."""
