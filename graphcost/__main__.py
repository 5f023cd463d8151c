"""``python -m graphcost`` is the ``graphcost`` command."""
# graphcost.analyzer exists only through pyproject's package-dir (see graphcost/__init__.py):
# pyright: reportMissingImports=false
from graphcost.analyzer.cli.main import console

raise SystemExit(console())
