"""``graphcost calibrate``: measure this machine's kernels and write the device profile that
``--device-profile FILE`` prices a model's time with (analyzer/measure/calibrate.py)."""
from __future__ import annotations

import json
import sys

from ...passes.device.profile import profile_to_json
from ...passes.errors import GraphcostError
from .main import Parser


def build_parser():
    p = Parser(prog="graphcost calibrate",
               description="Measure what matmuls, convolutions, attention, memory-bound "
                           "kernels and kernel launches achieve on this machine (eager "
                           "PyTorch and ONNX Runtime, at torch's thread count), check the "
                           "estimates built on them against real runs of small models, and "
                           "write the profile: about two minutes.")
    p.add_argument("-o", "--output", required=True, metavar="FILE.json",
                   help="where to write the profile (then: graphcost MODEL "
                        "--device-profile FILE.json)")
    p.add_argument("--engine", choices=("torch", "onnxruntime", "both"), default="both",
                   help="measure eager PyTorch, ONNX Runtime or both (default)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="measure with N intra-op threads (default: torch's, the cores it "
                        "sees); estimates from the profile are for runs with as many")
    p.add_argument("--no-validation", action="store_true",
                   help="skip the validation runs: the profile's estimates then carry no "
                        "error band")
    return p


def run(args) -> int:
    from ..measure.calibrate import calibrate
    from ..measure.calibrate_runs import validation_runs
    from .output import check_writable

    check_writable(args.output, "--output")
    if args.threads is not None:
        if not 1 <= args.threads <= 1024:
            raise GraphcostError(f"--threads {args.threads}: expected 1 to 1024")
        import torch
        torch.set_num_threads(args.threads)
    engines = ("torch", "onnxruntime") if args.engine == "both" else (args.engine,)
    say = (lambda text: print(f"graphcost: {text}", file=sys.stderr)) if sys.stderr.isatty() \
        else (lambda _: None)
    say("measuring kernels")
    profile = calibrate(None if args.no_validation else
                        (lambda p: validation_runs(p, say)), engines)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(profile_to_json(profile), f, indent=1)
        f.write("\n")
    for name, engine in profile.engines.items():
        band = engine.band
        print(f"{name:12s} launch {engine.launch_s * 1e6:.1f} µs; "
              + (f"estimates within ±{band:.0%} on {len(engine.validation)} runs here"
                 if band is not None else "not validated"))
    print(f"wrote {args.output}")
    return 0
