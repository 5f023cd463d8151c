"""--serve's capacities (the most sequences of the traced length, the longest context at the
traced batch) against the exact method: the batch traced at the capacity and one above,
replayed whole through the allocator model (itself checked against CUDA's reserved bytes in
test_cuda_traces.py), and the fits line they share at the traced batch."""
from __future__ import annotations

from dataclasses import replace
from functools import cache

from graphcost.analyzer.app.devices import get_device
from graphcost.analyzer.app.pipeline import run_passes
from graphcost.analyzer.app.request import PassOptions
from graphcost.analyzer.load.serving import ServeSpec, load_serving
from graphcost.models_zoo import build_model
from graphcost.passes.serving.analysis import Serving

A100 = get_device("a100-80gb")
PROMPT, GENERATE = 96, 32


@cache
def traced(batch: int):
    return load_serving(build_model("llama_tiny"), None, batch=batch,
                        serve=ServeSpec(prompt=PROMPT, generate=GENERATE))


def review(batch: int, offers: int | None = None) -> Serving:
    """The serving review of ``batch`` sequences on an A100 offering ``offers`` bytes."""
    device = A100 if offers is None else replace(A100, usable_memory=offers)
    graph, trace = traced(batch)
    s = run_passes(graph, PassOptions(device=device), serving=trace).serving
    assert s is not None and s.fit is not None
    return s


def test_the_capacities_meet_the_fits_line_at_the_traced_batch():
    s = review(2)
    outside = s.fit.needs - s.reserved_peak_bytes      # the CUDA context: not the allocator's
    assert outside == s.fit.parts[-1].bytes
    # a device offering exactly what batch 2 needs: it fits, and so do 2 sequences of 128
    # tokens and 128 tokens at batch 2; a byte less: neither
    just = review(2, s.fit.needs)
    assert just.fit.fits and just.fit.margin == 0
    assert just.max_concurrent_sequences >= 2 and just.max_context >= PROMPT + GENERATE
    short = review(2, s.fit.needs - 1)
    assert not short.fit.fits
    assert short.max_concurrent_sequences < 2 and short.max_context < PROMPT + GENERATE


def test_max_sequences_as_the_batch_traced_there_fits():
    # 40 MiB for the allocator. Traced and replayed, llama_tiny at 128 tokens reserves 32 MiB
    # at 18 sequences, 34 MiB (seventeen 2 MiB small-pool segments) at 19 to 21, and 48 MiB at
    # 22, where its largest tensors pass 1 MiB into the large pool's 20 MiB segments. The
    # batch-2 replay scaled (its tensors all grow with the batch but the 2.4 MiB of weights)
    # gives the same at the batches looked at, 2 to 32, but 22 and 23 (50 MiB: it scales the rotary
    # table and the mask too), so 21 sequences: traced at 21 it fits, at 22 it does not
    base = review(2)
    offers = base.fit.needs - base.reserved_peak_bytes + 40 * 2**20
    n = review(2, offers).max_concurrent_sequences
    assert n == 21
    assert review(n, offers).fit.fits
    assert not review(n + 1, offers).fit.fits


def test_the_capacities_meet_the_fits_line_with_a_given_allocator_share():
    # --overhead allocator=10%: the allocator is the tensors × 1.1 in the fits line, and so in
    # the capacities (each the batch's tensors, scaled, × 1.1): at the traced batch they agree
    from graphcost.passes.device.fits import Overhead
    given = Overhead(allocator_fraction=0.1)

    def at(offers: int | None) -> Serving:
        device = A100 if offers is None else replace(A100, usable_memory=offers)
        graph, trace = traced(2)
        s = run_passes(graph, PassOptions(device=device, overhead=given), serving=trace).serving
        assert s is not None and s.fit is not None
        return s
    needs = at(None).fit.needs
    just, short = at(needs), at(needs - 1)
    assert just.fit.fits and not short.fit.fits
    assert just.max_concurrent_sequences >= 2 and just.max_context >= PROMPT + GENERATE
    assert short.max_concurrent_sequences < 2 and short.max_context < PROMPT + GENERATE
