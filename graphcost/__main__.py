"""``python -m graphcost`` is the ``graphcost`` command."""
from graphcost.analyzer.cli import main

raise SystemExit(main())
