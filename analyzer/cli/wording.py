"""The command line's words for the request's options: an error about ``dims`` key ``seq``
value 0 reads ``--dim seq=0`` here (passes/errors.py: the API says ``dims={'seq': 0}``)."""
from __future__ import annotations

from ...passes.errors import GraphcostError, Option, worded

FLAGS = {
    "dims": "--dim", "input_shapes": "--input-shape", "input_dtypes": "--input-dtype",
    "checkpoint.every": "--checkpoint-every", "checkpoint.budget": "--budget",
    "checkpoint.nth": "--checkpoint-nth",
    "parallel": "--parallel", "parallel.world_size": "--world-size",
    "parallel.offload": "--offload", "parallel.bucket_cap_mb": "--bucket-cap-mb",
    "parallel.units": "--fsdp-units", "parallel.interconnect": "--interconnect",
    "parallel.async_tp": "--async-tp", "parallel.gpus_per_node": "--nodes-of",
    "parallel.float8_all_gather": "--float8-all-gather",
    "parallel.microbatches": "--microbatches", "parallel.schedule": "--pp-schedule",
    "parallel.stages_per_rank": "--pp-stages-per-rank", "parallel.cp_rotate": "--cp-rotate",
    "zoo_exporter": "--fx", "serve.prompt": "--prompt", "serve.generate": "--generate",
    "serve.kv_dtype": "--kv-dtype", "serve.weight_dtype": "--weight-dtype",
    "serve.engine": "--engine",
    "serve.logits": "--logits",
}


def flag(name: str) -> str:
    """``name``'s option on the command line (``all_layers`` → ``--all-layers``)."""
    return FLAGS.get(name, "--" + name.replace("_", "-"))


def cli_word(o: Option) -> str:
    word = flag(o.name)
    if o.name == "zoo_exporter":  # a flag of its own, not a value
        return word
    if o.key is not None:
        return f"{word} {o.key}" + (f"={o.value}" if o.value is not None else "")
    return word if o.value is None else f"{word} {o.value}"


def cli_message(exc: GraphcostError) -> str:
    """``exc``'s message as the command line says it."""
    return exc.worded(cli_word)


def cli_text(text: str) -> str:
    """Any text naming options (``opt``) in the command line's words."""
    return worded(text, cli_word)
