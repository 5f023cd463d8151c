"""The schedule of FSDP2 (``fully_shard``): zero3 / fsdp, and zero2 (its
``reshard_after_forward=False``), on the step's clock (passes/parallel_clock.py).

What torch/distributed/fsdp/_fully_shard does, per unit, in the order it does it:

* forward, pre-forward: all-gather into a flat buffer (N × the padded shard; the local shard is
  copied into its slot), then copy out into the unsharded parameters. The flat buffer is held
  through the next unit's copy-out (``all_gather_state``, dropped by the next
  ``wait_for_unshard``, whose local variable keeps it until that copy-out returns); the root's
  post-forward frees the last one. The root is gathered first and never
  resharded until the end of backward; a block is resharded after its forward (zero3) or at
  its post-backward (zero2).
* backward, pre-backward (as the gradient reaches the unit's output): copy out the all-gather
  prefetched by the unit that ran before in backward (the root prefetches the last block),
  freeing its flat buffer at once, then prefetch the next one.
* post-backward (as the gradient of the unit's input is ready; at the end of backward for the
  root and units whose inputs need no gradient, root first): reshard, release the previous
  reduce-scatter input, copy the unsharded gradients into a padded reduce-scatter input (then
  freed), reduce-scatter into the sharded gradient. That input is held until the next
  post-backward, the last one until backward ends.
* the optimizer steps on shards; rank 0 holds the largest (torch.chunk's first chunk).

With one rank nothing is all-gathered (the shard is copied into the unsharded parameters).

Under ``MixedPrecisionPolicy(param_dtype=half, reduce_dtype=fp32)`` (a master recipe; the
graph is re-typed to half) the all-gather, the unsharded parameters and their gradients are
half (the graph's sizes) and the shards, the reduce-scatter input (the gradients cast to
``reduce_dtype``), the sharded gradients and the optimizer fp32: ``plan.master`` times the
graph's bytes; at each reduce-scatter copy-in the unit's gradients exist a moment longer as
fp32 copies (``foreach_reduce`` casts them to ``reduce_dtype`` before copying them in).
"""
from __future__ import annotations

from .choices import Offload, Strategy
from .comm import comm_volume
from .parallel_clock import Clock
from .parallel_units import ROOT, padded_bytes

# The CUDA streams FSDP2 allocates on (FSDPCommContext): all-gather outputs on the copy-in
# stream (``_get_all_gather_streams``: implicit prefetching in forward and pre-backward), the
# reduce-scatter output (the sharded gradients' storage) inside
# ``torch.cuda.stream(reduce_scatter_stream)`` (``foreach_reduce``); its input, the copy-out,
# the gradients and the optimizer on the default stream. A block cached on one stream serves
# no other (passes/caching_allocator.py). Read off PyTorch 2.11's allocator trace on an H200
# (benchmarks/results/cuda_traces_h200.json.gz: the reduce-scatter inputs are default-stream
# blocks there).
DEFAULT_STREAM, ALL_GATHER_STREAM, REDUCE_SCATTER_STREAM = 0, 1, 2


# long: places one rank's tensors on the clock per FSDP phase; the phases share the unit table
def sharded_step(plan, clock: Clock, world: int):
    """Place one rank's tensors on ``clock``; returns (units, host bytes, comm volume).
    ``plan``: passes.parallel's _Plan (the step's tensors, the units, the spec)."""
    spec, n, fwd_end = plan.spec, clock.n, plan.forward_end
    trainable = set(plan.trainable)
    units = [u.sized(plan.graph, trainable, world) for u in plan.units]
    blocks = [u for u in units if u.name != ROOT]
    root = units[-1]
    reshard = spec.strategy != Strategy.ZERO2
    flat = world > 1
    # the root's post-forward frees the last all-gather: after its own last forward op
    last_fwd = max((i for i in range(fwd_end) if plan.graph.nodes[i].scope),
                   default=fwd_end - 1)
    gathered = [u for u in blocks if u.backward is not None]
    during = sorted((u for u in gathered if not u.post_backward_deferred),
                    key=lambda u: -u.backward[1])
    final = [root] + [u for u in blocks if u not in during]
    # events, in the order a gap runs them: post-backward (0), the root's prefetch and the
    # forward gathers (1), a unit's backward copy-out (2), the prefetch it then issues (3)
    ev = {(ROOT, "ag"): clock.before(0, 1, "root: all-gather"),
          (ROOT, "out"): clock.before(0, 1, "root: copy-out")}
    for u in blocks:
        ev[u.name, "ag"] = clock.before(u.forward[0], 1, f"{u.name}: all-gather")
        ev[u.name, "out"] = clock.before(u.forward[0], 1, f"{u.name}: copy-out")
    if reshard:
        prev = None
        for u in reversed(gathered):
            at, order = (min(fwd_end, n), 1) if prev is None else (prev.backward[0], 3)
            ev[u.name, "bag"] = clock.before(at, order, f"{u.name}: prefetch all-gather")
            ev[u.name, "bout"] = clock.before(u.backward[0], 2, f"{u.name}: backward copy-out")
            prev = u
    for u in during:
        ev[u.name, "rs0"] = clock.before(u.backward[1] + 1, 0,
                                         f"{u.name}: reduce-scatter copy-in")
        ev[u.name, "rs1"] = clock.before(u.backward[1] + 1, 0, f"{u.name}: reduce-scatter")
    for u in final:
        ev[u.name, "rs0"] = clock.before(n, 0, f"{u.name}: reduce-scatter copy-in "
                                               "(end of backward)")
        ev[u.name, "rs1"] = clock.before(n, 0, f"{u.name}: reduce-scatter (end of backward)")
    clear_ev = clock.before(n, 1, "reduce-scatter inputs released")
    clock.freeze()
    end, clear = clock.size, clock.at(clear_ev)
    pos = {k: clock.at(e) for k, e in ev.items()}
    offload = spec.offload == Offload.PARAMS
    m = plan.master
    shard_total = m * sum(u.shard_bytes for u in units)
    values = plan.graph.values

    def each(u, size, only_trainable=False):     # per parameter of a unit: its tensors' bytes
        return [size(values[p].spec) for p in u.members
                if not only_trainable or p in trainable]
    if not offload:       # FSDPParam: one padded shard per parameter
        clock.add(0, end, shard_total, "sharded_params",
                  [b for u in units for b in each(u, lambda s: m * padded_bytes(s, world)
                                                  // world)])
    clock.add(0, end, plan.buffer_bytes, "buffers", plan.buffer_sizes)
    seq = [root, *blocks]
    for k, u in enumerate(seq):
        a, o = pos[u.name, "ag"], pos[u.name, "out"]
        # freed by the next unit's wait_for_unshard, which still holds it through its copy-out
        held = pos[seq[k + 1].name, "out"] + 1 if k + 1 < len(seq) else \
            clock.node(last_fwd) + 1
        # the copy-out's unsharded parameters: one all-gather output per parameter
        unsharded = each(u, lambda s: padded_bytes(s, world))
        if flat:
            clock.add(a, held, u.padded_bytes, "all_gather_buffers", stream=ALL_GATHER_STREAM)
        if offload:        # the host shard copied to the device for the all-gather
            clock.add(a, o + 1, m * u.shard_bytes, "offload_staging")
        off = pos[u.name, "rs0"] if u is root or not reshard else clock.node(u.forward[1]) + 1
        clock.add(o, off, u.padded_bytes, "unsharded_params", unsharded)
        if (u.name, "bag") in pos:
            b0, b1 = pos[u.name, "bag"], pos[u.name, "bout"]
            if flat:
                clock.add(b0, b1 + 1, u.padded_bytes, "all_gather_buffers",
                          stream=ALL_GATHER_STREAM)
            if offload:
                clock.add(b0, b1 + 1, m * u.shard_bytes, "offload_staging")
            clock.add(b1, pos[u.name, "rs0"], u.padded_bytes, "unsharded_params", unsharded)
    order = [*during, *final]
    for k, u in enumerate(order):
        if not u.grad_padded_bytes:
            continue
        r0, r1 = pos[u.name, "rs0"], pos[u.name, "rs1"]
        until = pos[order[k + 1].name, "rs0"] if k + 1 < len(order) else clear
        clock.add(r0, until, m * u.grad_padded_bytes, "reduce_scatter_inputs")
        if m > 1:
            casts = each(u, lambda s: m * (s.nbytes or 0), only_trainable=True)
            clock.add(r0, r0 + 1, sum(casts), "reduce_dtype_casts", casts)
        # the reduce-scatter's output: the unit's sharded gradients are views into it
        clock.add(r1, r1 + 1 if offload else end, m * u.grad_padded_bytes // world,
                  "sharded_grads", stream=REDUCE_SCATTER_STREAM)
    rs1 = {p: pos[u.name, "rs1"] for u in units for p in u.members}
    plan.place_storages(clock, lambda ps: max(rs1[p] for p in ps), "unsharded_grads")
    sizes = [m * padded_bytes(plan.graph.values[p].spec, world) // world
             for p in plan.trainable]
    host = plan.place_optimizer(clock, sizes)
    if offload:
        host.update(params=shard_total,
                    grads=m * sum(u.grad_padded_bytes for u in units) // world)
    regather = sum(u.padded_bytes for u in gathered) if reshard else 0
    calls = len(units) + (len(gathered) if reshard else 0) + \
        sum(1 for u in units if u.grad_padded_bytes)
    comm = comm_volume(world, sum(u.padded_bytes for u in units) + regather,
                       m * sum(u.grad_padded_bytes for u in units), 0, calls,
                       spec.interconnect)
    return tuple(units), host, comm
