"""Run by a Python that has vLLM (its own venv: vLLM pins torch and transformers below
graphcost's floors, so graphcost is not installed beside it; .ci/run makes that venv and names
its Python in GRAPHCOST_VLLM_PYTHON): parses each list of arguments after ``vllm serve`` in
the JSON list on its stdin with vLLM's own ``serve`` subcommand parser and prints the fields
each read, a JSON list (one process: importing vLLM takes 20 s here).
A CPU machine runs it with VLLM_TARGET_DEVICE=cpu (else vLLM cannot infer a device for its
defaults; its CPU-only CI does the same with an accelerator wheel)."""
import json
import sys

from vllm.entrypoints.cli.serve import ServeSubcommand

try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:   # (vLLM releases before the module moved)
    from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef]

FIELDS = ("model_tag", "tensor_parallel_size", "max_num_seqs", "max_model_len",
          "max_num_batched_tokens", "gpu_memory_utilization", "dtype", "quantization",
          "kv_cache_dtype")

parser = FlexibleArgumentParser(prog="vllm")
ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
read = [parser.parse_args(["serve", *args]) for args in json.load(sys.stdin)]
print(json.dumps([{f: getattr(parsed, f) for f in FIELDS} for parsed in read]))
