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
    p.add_argument("--device", metavar="GPU",
                   help="measure eager PyTorch on this machine's CUDA GPU instead, GPU "
                        "being its row of graphcost devices (h100-sxm, h200, ...); the "
                        "profile then prices a step with --device GPU --device-profile FILE")
    p.add_argument("--no-validation", action="store_true",
                   help="skip the validation runs: the profile's estimates then carry no "
                        "error band")
    return p


def run(args) -> int:
    from ..measure.calibrate import calibrate
    from ..measure.calibrate_runs import validation_runs
    from .output import check_writable

    check_writable(args.output, "--output")
    if args.device is not None:
        return _run_gpu(args)
    if args.threads is not None:
        if not 1 <= args.threads <= 1024:
            raise GraphcostError(f"--threads {args.threads}: expected 1 to 1024")
        import torch
        torch.set_num_threads(args.threads)
    engines = ("torch", "onnxruntime") if args.engine == "both" else (args.engine,)
    say = _say()
    say("measuring kernels")
    profile = calibrate(None if args.no_validation else
                        (lambda p: validation_runs(p, say)), engines)
    return _written(profile, args.output)


def _say():
    return (lambda text: print(f"graphcost: {text}", file=sys.stderr)) if sys.stderr.isatty() \
        else (lambda _: None)


def _run_gpu(args) -> int:
    """The CUDA GPU ``--device`` names, measured (analyzer/measure/calibrate_cuda.py)."""
    import torch

    from ..app.devices import get_device
    from ..measure.calibrate_cuda import calibrate_gpu
    from ..measure.calibrate_cuda_runs import gpu_validation_runs

    rates = get_device(args.device)
    if not rates.is_gpu:
        raise GraphcostError(f"--device {args.device}: not a GPU (graphcost devices lists "
                             "them); without --device, calibrate measures this CPU")
    if args.engine == "onnxruntime" or args.threads is not None:
        raise GraphcostError(f"--device {args.device} measures eager PyTorch on the GPU: "
                             "--engine onnxruntime and --threads are for this CPU's profile")
    if not torch.cuda.is_available():
        raise GraphcostError(f"--device {args.device}: no CUDA GPU is visible here "
                             "(torch.cuda.is_available() is False)")
    say, device = _say(), torch.device("cuda")
    say(f"measuring kernels on {torch.cuda.get_device_name(device)}")
    profile = calibrate_gpu(rates, device, None if args.no_validation else
                            (lambda p: gpu_validation_runs(p, rates, device, say)))
    return _written(profile, args.output)


def _written(profile, output: str) -> int:
    with open(output, "w", encoding="utf-8") as f:
        json.dump(profile_to_json(profile), f, indent=1)
        f.write("\n")
    for name, engine in profile.engines.items():
        band = engine.band
        print(f"{name:12s} launch {engine.launch_s * 1e6:.1f} µs; "
              + (f"estimates within ±{band:.0%} on {len(engine.validation)} runs here"
                 if band is not None else "not validated"))
    print(f"wrote {output}")
    return 0
