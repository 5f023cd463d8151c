"""Time on this CPU (issue 46): graphcost's estimate with a profile from ``graphcost
calibrate`` against the measured wall time of eager PyTorch forwards and training steps and of
ONNX Runtime sessions, over zoo and transformers models at several batches and sequences.

    python -m benchmarks.time_cpu [--profile FILE] [--threads N] [--passes N] [--markdown OUT]

Without --profile it calibrates first (about two minutes). Each measured time is the fastest
of several runs (analyzer/measure/microbench.py's ``fastest``), as the profile's are, in each
of two passes over the table (``--passes``), the faster kept. Prints one
row per run and the median and 90th-percentile absolute error (the acceptance: ≤ 15% and
≤ 30%); --markdown writes the same table (benchmarks/results/time_cpu.md).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

# (zoo name, batch, dims): eager forwards
FORWARD = [
    ("small_cnn", 8, {}), ("mnist_net", 32, {}), ("three_conv", 4, {"height": 64, "width": 64}),
    ("resnet18", 1, {}), ("resnet18", 8, {}), ("resnet50", 1, {}), ("mobilenet_v2", 1, {}), ("mobilenet_v2", 8, {}),
    ("vgg16", 1, {}), ("unet", 1, {}), ("gpt2", 1, {"seq": 64}), ("gpt2", 8, {"seq": 128}),
    ("bert", 4, {}), ("llama_tiny", 2, {"seq": 128}), ("mlp", 64, {}), ("hf_gpt2", 2, {}),
    ("hf_llama", 2, {}), ("hf_qwen2", 2, {}), ("hf_bert", 2, {}), ("hf_t5", 2, {}),
    ("hf_vit", 1, {}), ("hf_mixtral", 1, {}),
]
# (zoo name, batch, dims, optimizer): eager training steps
STEPS = [
    ("small_cnn", 8, {}, "sgd"), ("resnet18", 4, {}, "sgd"), ("mobilenet_v2", 4, {}, "adam"),
    ("gpt2", 4, {}, "adamw"), ("bert", 4, {}, "adamw"), ("llama_tiny", 2, {}, "adamw"),
    ("mlp", 64, {}, "adam"), ("hf_llama", 2, {}, "adamw"), ("hf_gpt2", 2, {}, "adamw"),
    ("hf_bert", 2, {}, "adamw"), ("hf_vit", 1, {}, "adamw"), ("resnet18", 8, {}, "momentum"),
]
# (zoo name, batch): ONNX Runtime sessions
ONNX = [("small_cnn", 8), ("resnet18", 1), ("resnet18", 8), ("resnet50", 1),
        ("mobilenet_v2", 1), ("vgg16", 1), ("unet", 1), ("gpt2", 4), ("bert", 4), ("mlp", 64)]


def _model(name: str, batch: int, dims: dict, train: bool = False):
    """The model and its inputs: by name for a transformers model, else positional."""
    from graphcost.models_zoo import registry
    from graphcost.models_zoo.measurable import build_measurable, example_kwargs

    model = build_measurable(name)
    inputs = example_kwargs(name, batch, **dims)
    return (model.train() if train else model.eval()), \
        (inputs if registry.get(name).hf else tuple(inputs.values()))


def _call(model, inputs):
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def forward(name, batch, dims, profile):
    import torch
    from graphcost.analyzer.measure.microbench import fastest

    from graphcost import analyze

    model, inputs = _model(name, batch, dims)
    with torch.no_grad():
        measured = fastest(lambda: _call(model, inputs), budget=0.2)
    report = analyze(model, inputs, device_profile=profile)
    return measured, report.time


def step(name, batch, dims, optimizer, profile):
    from graphcost.analyzer.measure.microbench import fastest
    from graphcost.analyzer.measure.reference import eager_training_step

    from graphcost import analyze

    model, inputs = _model(name, batch, dims, train=True)
    run, _ = eager_training_step(model, (), optimizer, inputs) if isinstance(inputs, dict) \
        else eager_training_step(model, inputs, optimizer)
    run()
    measured = fastest(run, budget=0.2)
    model, inputs = _model(name, batch, dims, train=True)
    report = analyze(model, inputs, train=True, optimizer=optimizer, what_if=False,
                     include_inputs=False, device_profile=profile)
    return measured, report.time


def session(name, batch, profile, folder: Path):
    from graphcost.analyzer.measure.calibrate_runs import timed_session

    from graphcost import analyze

    model, inputs = _model(name, batch, {})
    path = folder / f"{name}-{batch}.onnx"
    measured = timed_session(model, inputs, path, budget=0.2)
    return measured, analyze(str(path), device_profile=profile).time


def rows(profile):
    for name, batch, dims in FORWARD:
        yield f"{name} b{batch}{_dims(dims)}", "forward", *forward(name, batch, dims, profile)
    for name, batch, dims, optimizer in STEPS:
        yield (f"{name} b{batch}{_dims(dims)}", f"{optimizer} step",
               *step(name, batch, dims, optimizer, profile))
    with tempfile.TemporaryDirectory() as folder:
        for name, batch in ONNX:
            yield f"{name} b{batch}", "onnxruntime", *session(name, batch, profile, Path(folder))


def _dims(dims: dict) -> str:
    return "".join(f" {k}={v}" for k, v in dims.items())


def main(argv=None) -> int:
    import torch
    from graphcost.analyzer.measure.calibrate import calibrate
    from graphcost.analyzer.measure.calibrate_runs import validation_runs
    from graphcost.passes.device.profile import profile_from_json, profile_to_json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", help="a profile graphcost calibrate wrote (default: calibrate)")
    ap.add_argument("--markdown", help="write the table here too")
    ap.add_argument("--threads", type=int, help="torch's intra-op threads (default: torch's)")
    ap.add_argument("--passes", type=int, default=2,
                    help="passes over the table, each run's fastest kept (default 2)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.profile:
        profile = profile_from_json(json.loads(Path(args.profile).read_text()))
    else:
        print("calibrating …", file=sys.stderr)
        profile = calibrate(validation_runs)
        Path("/tmp/graphcost-profile.json").write_text(json.dumps(profile_to_json(profile)))
    lines = ["| model | run | measured | estimated | error |", "|---|---|---:|---:|---:|"]
    errors = []
    # each run measured in every pass over the table, its fastest kept: the machine slows
    # for minutes at a time, longer than one measurement's fastest-of-five spans
    passes = [list(rows(profile)) for _ in range(args.passes)]
    for runs in zip(*passes):
        model, mode, _, estimate = runs[0]
        measured = min(run[2] for run in runs)
        error = estimate.seconds / measured - 1
        errors.append(abs(error))
        lines.append(f"| {model} | {mode} | {measured * 1e3:.2f} ms | "
                     f"{estimate.seconds * 1e3:.2f} ms | {error:+.0%} |")
        print(lines[-1], flush=True)
    errors.sort()
    p90 = errors[min(len(errors) - 1, -(-9 * len(errors) // 10) - 1)]
    summary = (f"{len(errors)} runs: median absolute error {statistics.median(errors):.1%}, "
               f"90th percentile {p90:.1%} (acceptance: ≤ 15%, ≤ 30%)")
    print(summary)
    if args.markdown:
        m = profile.measured
        head = [f"# Time on this CPU: estimated against measured ({m.get('date', '?')})", "",
                f"Profile: {profile.name}, {m.get('cpu', '?')}, torch {torch.__version__}, "
                f"{m.get('threads', '?')} thread(s); `python -m benchmarks.time_cpu "
                f"--threads {torch.get_num_threads()} --markdown "
                "benchmarks/results/time_cpu.md`.", "", summary, ""]
        Path(args.markdown).write_text("\n".join(head + lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
