"""The command line's option names in an error message, said in the Python API's argument
names (``--dim seq=N`` → ``dims={'seq': N}``): ``analyze`` and ``verify`` raise the reworded
message, so each caller reads the names it typed."""
from __future__ import annotations

import re

_API_WORDS = [
    (re.compile(r"--dim (\w+)=([^\s,;)]+)"), r"dims={'\1': \2}"),
    (re.compile(r"--dim (\w+)"), r"dims['\1']"),
    (re.compile(r"--dim\b"), "dims"),
    (re.compile(r"--input-shape (\w+)=([^\s,;)]+)"), r"input_shapes={'\1': (\2)}"),
    (re.compile(r"--input-shape (\w+)"), r"input_shapes['\1']"),
    (re.compile(r"--input-shape\b"), "input_shapes"),
    (re.compile(r"--input-dtype (\w+)=([^\s,;:)]+)"), r"input_dtypes={'\1': '\2'}"),
    (re.compile(r"--input-dtype (\w+)"), r"input_dtypes['\1']"),
    (re.compile(r"--input-dtype\b"), "input_dtypes"),
    (re.compile(r"--batch (\S+)"), r"batch=\1"),
    (re.compile(r"--batch\b"), "batch"),
    (re.compile(r"--checkpoint-every\b"), "checkpoint={'every': N}"),
    (re.compile(r"--budget\b"), "checkpoint={'budget': BYTES}"),
    (re.compile(r"--train\b"), "train=True"),
    (re.compile(r"--optimizer-impl\b"), "optimizer_impl"),
    (re.compile(r"--parallel STRATEGY\b"), "parallel={'strategy': ...}"),
    (re.compile(r"--parallel (\w+)"), r"parallel={'strategy': '\1'}"),
    (re.compile(r"--parallel\b"), "parallel"),
    (re.compile(r"--world-size N\b"), "parallel['world_size']=N"),
    (re.compile(r"--world-size (\S+)"), r"parallel['world_size']=\1"),
    (re.compile(r"--world-size\b"), "parallel['world_size']"),
    (re.compile(r"--offload (\w+)"), r"parallel['offload']='\1'"),
    (re.compile(r"--offload\b"), "parallel['offload']"),
    (re.compile(r"--bucket-cap-mb\b"), "parallel['bucket_cap_mb']"),
    (re.compile(r"--fsdp-units (\S+):"), r"parallel['units'] entry '\1':"),
    (re.compile(r"--fsdp-units\b"), "parallel['units']"),
    (re.compile(r"--interconnect (\S+):"), r"parallel['interconnect']='\1':"),
    (re.compile(r"--interconnect\b"), "parallel['interconnect']"),
    (re.compile(r"--(checkpoint|precision|optimizer|lifetimes|tf32|overhead)\b"), r"\1"),
    (re.compile(r"--device(-spec)?\b"), "device"),
    (re.compile(r"--fx\b"), "zoo_exporter='fx'"),
    (re.compile(r"--(prompt|generate)\b"), r"serve['\1']"),
    (re.compile(r"--kv-dtype\b"), "serve['kv_dtype']"),
    (re.compile(r"--weight-dtype\b"), "serve['weight_dtype']"),
    (re.compile(r"--serve\b"), "serve"),
]


def api_wording(message: str) -> str:
    """``message`` with the command line's option names replaced by the API's arguments."""
    for pattern, repl in _API_WORDS:
        message = pattern.sub(repl, message)
    return message
