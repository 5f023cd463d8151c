"""Analysis passes: pure functions from an ``analyzer.ir.Graph`` to results keyed by node/value."""
