"""``python -m graphcost`` is the ``graphcost`` command."""
from graphcost.analyzer.cli import console

raise SystemExit(console())
