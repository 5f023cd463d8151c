"""Prototype for issue 10 part 2 (serving): prefill and one decode step of a transformers
decoder traced with the KV cache as plain graph inputs/outputs, lowered by graphcost and
checked against the real cache, FlopCounterMode and MemTracker. Not part of the package.

    PYTHONPATH=$PWD python notes/kv_decode_prototype.py [gpt2|llama|qwen2]

Why a wrapper: a DynamicCache passed across the torch.export boundary (with transformers'
``register_dynamic_cache_export_support``) exports, but ``run_decompositions`` then fails
("Constant tensor lifted_tensor_N is not in the constants dictionary": the cache's pytree
unflatten creates tensors again when the program is re-traced). Building the cache inside the
traced function from flat tensors — and handing the layers the given tensors as they are, no
copy, as after earlier steps — avoids it; prefill is the same step with 0-long cache inputs.
"""
from __future__ import annotations

import sys
import warnings

import torch
from torch.utils.flop_counter import FlopCounterMode

warnings.filterwarnings("ignore")


def cache_of(config, flat):
    """A DynamicCache whose layers hold the given (k, v) tensors themselves."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    for layer, k, v in zip(cache.layers, flat[0::2], flat[1::2]):
        layer.dtype, layer.device = k.dtype, k.device
        layer.keys, layer.values, layer.is_initialized = k, v, True
    return cache


class Step(torch.nn.Module):
    """(input_ids, attention_mask, *cache) -> (logits, *new cache): one prefill/decode step."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, *kv):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         past_key_values=cache_of(self.model.config, kv), use_cache=True)
        return (out.logits, *[t for layer in out.past_key_values.layers
                              for t in (layer.keys, layer.values)])


def trace(step, args):
    from graphcost.analyzer.frontends.fx_frontend import lower_exported
    from graphcost.analyzer.frontends.torch_capture import export_module
    from graphcost.analyzer.pipeline import run_passes

    refs: dict[str, str] = {}
    ep = export_module(step, args, name="step", references=refs)
    graph = lower_exported(ep, name="step", references=refs)
    return graph, run_passes(graph, include_inputs=False)


def main(name: str = "gpt2", batch: int = 2, prompt: int = 24, generate: int = 8) -> None:
    from graphcost.analyzer.verify import measure_inference
    from graphcost.models_zoo import hf

    torch.manual_seed(0)
    model = getattr(hf, name)().eval()
    cfg = model.config
    step = Step(model)
    kvh = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    hd = cfg.hidden_size // cfg.num_attention_heads
    for phase, length in (("prefill", prompt), ("decode", 1)):
        if phase == "prefill":
            kv = [torch.empty(batch, kvh, 0, hd) for _ in range(2 * cfg.num_hidden_layers)]
        else:  # the cache as transformers keeps it after P + G − 1 tokens (sliding layers: W − 1)
            with torch.no_grad():
                past = model(input_ids=torch.randint(0, hf.VOCAB, (batch, prompt + generate - 1)),
                             use_cache=True).past_key_values
            kv = [t.clone() for layer in past.layers for t in (layer.keys, layer.values)]
        context = kv[0].shape[-2] + length
        args = (torch.randint(0, hf.VOCAB, (batch, length)),
                torch.ones(batch, context, dtype=torch.long), *kv)
        graph, r = trace(step, args)
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            real = step(*args)
        traced_kv = sum(graph.spec(o).nbytes for o in graph.outputs[1:])
        real_kv = sum(t.numel() * t.element_size() for t in real[1:])

        class Call(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.step = step

            def forward(self):
                return self.step(*args)

        print(f"{name} {phase}: cache {[tuple(t.shape) for t in real[1::2]]}; KV bytes traced "
              f"{traced_kv:,} real {real_kv:,}; FLOPs {2 * r.totals.macs:,} FlopCounterMode "
              f"{counter.get_total_flops():,}; activation peak {r.memory.peak_bytes:,} "
              f"MemTracker {measure_inference(Call(), ())[0]:,}; "
              f"unsupported {r.coverage.unsupported}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
