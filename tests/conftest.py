import os
from pathlib import Path

# Under pytest-xdist (the README's command runs one worker per core): one intra-op thread per
# worker, so that two workers' torch kernels do not fight over the same two cores. Set before
# torch is imported; the measurements are of bytes, not of time.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Zoo exports are cached across test runs (vgg16's takes ~10 s); never in the user's home.
os.environ.setdefault("GRAPHCOST_CACHE", str(Path(__file__).resolve().parent.parent / ".cache" / "zoo"))
