"""graphcost.analyzer: everything above the passes, one folder per layer (imports go down only).

- ``frontends/`` — model files and modules into the IR (``onnx/``, ``torch/``)
- ``app/`` — the application: the request, the API, the pipeline, the report, by-batch, serve,
  diff, devices
- ``measure/`` — verify: reference measurements of real runs (onnxruntime, PyTorch's trackers)
- ``render/`` — text, tables, HTML and plots of a report
- ``cli/`` — the command line
"""
