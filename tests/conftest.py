import os
from pathlib import Path

# Zoo exports are cached across test runs (vgg16's takes ~10 s); never in the user's home.
os.environ.setdefault("GRAPHCOST_CACHE", str(Path(__file__).resolve().parent.parent / ".cache" / "zoo"))
