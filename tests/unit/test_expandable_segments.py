"""The caching allocator's expandable segments as a stated fact of the stack (``--expandable-segments``,
``TrainConfig.allocator_expandable``): PyTorch's PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True maps one growing
virtual segment per stream, so the reserved memory carries no fragmentation term (``cost.memory``); without it
the caching allocator's fragmentation is reserved on top of the allocated peak. Each engine's stack launches it as
its scripts do (torchtitan's run_train.sh sets it; Megatron-LM's own scripts do not), and a user states theirs."""

import json

import pytest

from symtensor import api
from symtensor.cli import main
from symtensor.errors import PlanError
from symtensor.plan import Stack

ARGS = dict(tp=2, zero=1, micro_batch=1, global_batch=64, seq=2048)


def _memory(framework, zero, expandable):
    plan = api.evaluate("llama2-7b", "dgx-a100-80g", 8, framework=framework, **{**ARGS, "zero": zero},
                        stack=Stack(expandable_segments=expandable))
    return plan.report


@pytest.mark.parametrize("framework,zero,default", [("megatron", 1, False), ("fsdp2", 3, True)])
def test_stated_allocator_sets_the_fragmentation(framework, zero, default):
    """Stated expandable segments drop the fragmentation term; stated caching adds it; unstated is the engine's."""
    base, on, off = (_memory(framework, zero, e) for e in (None, True, False))
    assert base.memory_peak == on.memory_peak == off.memory_peak  # the allocated peak is the same
    assert on.memory_reserved < off.memory_reserved
    assert base.memory_reserved == (on if default else off).memory_reserved
    assert base.step_time_s == on.step_time_s == off.step_time_s


def test_json_names_it_only_where_stated(capsys):
    argv = ["evaluate", "llama2-7b", "--cluster", "dgx-a100-80g", "--devices", "8", "--tp", "2", "--zero", "1",
            "--micro-batch", "1", "--global-batch", "64", "--json"]
    for extra, expect in (([], None), (["--expandable-segments"], True), (["--no-expandable-segments"], False)):
        assert main(argv + extra) == 0
        config = json.loads(capsys.readouterr().out)["config"]
        assert config.get("expandable_segments") is expect


def test_a_search_holds_it_and_bad_values_are_refused():
    plan = api.plan("tiny-llama", "dgx-h100", 8, global_batch=16, seq=128, stack=Stack(expandable_segments=True))
    assert plan.train.stack.expandable_segments is True and plan.config["expandable_segments"] is True
    with pytest.raises(PlanError, match="expandable_segments='yes'"):
        Stack(expandable_segments="yes")
