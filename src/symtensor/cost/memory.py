"""Memory per device: the peak over the stages of the resident parameters, gradients and optimizer
state, the activations of the micro-batches in flight, the transient gathered parameters (ZeRO 3,
FSDP units) and the recomputation buffers."""

from __future__ import annotations

from symtensor.cost.engine import WEIGHTS, engine_of
from symtensor.cost.pipeline import Stage, inflight
from symtensor.cost.precision import RECIPES, weight_copy_bytes
from symtensor.cost.train import TrainConfig


def gathered_transient(st: Stage, train: TrainConfig) -> float:
    """Parameters gathered for compute beyond the resident shards, when the engine shards them at
    this ZeRO stage (``Engine.sharded_from``: ZeRO 3; FSDP2 at any stage > 0): an engine that
    reshards after forward holds the unit being computed and the one prefetched, two of the
    largest unit; one that does not (FSDP2 at ZeRO 1/2) keeps every unit gathered from its forward
    to its backward."""
    eng, z = engine_of(train), train.zero
    if not eng.shards(WEIGHTS, z):
        return 0.0
    if eng.reshards(z):
        return 2 * st.unsharded
    return sum(p.unsharded * times for p, times in st.params)


def fp8_copies(weight_bytes: float, train: TrainConfig) -> float:
    """The FP8 copies of ``weight_bytes`` of resident (or gathered) weights an engine keeps under an
    FP8 recipe (``precision.weight_copy_bytes``: Transformer Engine's cached FP8 weights and their
    transposes). Charged on every weight of the stage, the embedding and LM head (which stay BF16)
    included: an upper bound by their share."""
    per = weight_copy_bytes(RECIPES[train.fp8], not engine_of(train).pytorch_kernels)
    return weight_bytes / train.param_bytes * per


def memory_peak(stages: list[Stage], train: TrainConfig) -> tuple[dict, float]:
    """Per-stage memory (the peak: resident state, activations of the micro-batches in flight,
    the transient gathered parameters and recompute buffers); returns the breakdown of the
    most loaded stage and its peak."""
    best, peak = None, -1.0
    for s, st in enumerate(stages):
        if train.recompute == "full":
            layers_act = st.layer_inputs
            transient = max(st.layer_saved, default=0.0)
        else:
            layers_act, transient = sum(st.layer_saved), 0.0
        held = inflight(s, train)
        gathered = gathered_transient(st, train)
        mem = {"params": st.static["params"], "grads": st.static["grads"], "optimizer": st.static["optimizer"],
               "activations": (layers_act + st.other_saved) * held, "activations_layers": layers_act * held,
               "recompute_transient": transient, "gathered_params": gathered, "layer_state": st.layer_state}
        # what does not grow with the micro-batch: the state and the gathered parameters
        mem["static"] = mem["params"] + mem["grads"] + mem["optimizer"] + gathered
        if train.fp8 is not None:
            mem["fp8_weights"] = fp8_copies(mem["params"] + gathered, train)
            mem["static"] += mem["fp8_weights"]
        total = mem["static"] + mem["activations"] + transient
        mem["total"] = total
        if total > peak:
            best, peak = mem, total
    return best, peak


def static_peak(stages: list[Stage]) -> float:
    """The largest parameter + gradient + optimizer bytes of a stage: a lower bound of the memory
    peak under any recomputation."""
    return max(sum(st.static.values()) for st in stages)
