"""``python -m graphcost`` is the ``graphcost`` command."""
from graphcost.analyzer.cli.main import console

raise SystemExit(console())
