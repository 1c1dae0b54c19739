"""RunSpec: checked when built, strict JSON, refused against the model or world size before launch.

None of these tests needs torch: the spec is pure data, and ``run_spec`` refuses a bad spec before
it imports torch or starts a process.
"""

import subprocess
import sys

import pytest

from symtensor.errors import PlanError
from symtensor.models import load_model_config
from symtensor.runtime import launch
from symtensor.runtime.spec import ATTN_TP, MLP_TP, VOCAB_TP, RunSpec, check_fits

LLAMA = load_model_config("tiny-llama")      # heads 4, kv_heads 2, ffn 128, vocab 256, layers 2
MIXTRAL = load_model_config("tiny-mixtral")  # the same with experts 4, top_k 2


def local_plan(cfg, **config):
    """The plan of a Megatron configuration on as many of this machine's processes as it takes."""
    from symtensor.runtime.verify import local_cluster
    from symtensor.search import megatron_plan

    devices = config.get("tp", 1) * config.get("pp", 1) * config.get("dp", 1) * config.get("cp", 1)
    return megatron_plan(cfg, local_cluster(devices), **config)


def megatron(**kw) -> RunSpec:
    return RunSpec(**({"mesh": {"dp": 2, "tp": 2}, "tp_axis": "tp", "dp_axes": ("dp",),
                       "styles": ATTN_TP | MLP_TP} | kw))


def test_json_round_trip_and_hash():
    spec = megatron(layer_styles={1: {k: "replicate" for k in MLP_TP}}, sequence_parallel=False)
    again = RunSpec.from_dict(spec.to_dict())
    assert again == spec and hash(again) == hash(spec)
    assert spec.style(0, "mlp.up_proj") == "colwise" and spec.style(1, "mlp.up_proj") == "replicate"
    assert spec.style(None, "embed") == "replicate"


def test_style_order_does_not_matter():
    assert megatron(styles=MLP_TP | ATTN_TP) == megatron(styles=ATTN_TP | MLP_TP)


def test_bare_string_is_one_axis():
    assert megatron(dp_axes="dp") == megatron(dp_axes=("dp",))


def test_import_without_torch():
    """spec.py and the runtime package must import where torch is absent (the planner's CLI)."""
    code = ("import sys; import symtensor.runtime, symtensor.runtime.spec; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d | {"colour": 1}, r"unknown key\(s\) \['colour'\]"),
    (lambda d: {k: v for k, v in d.items() if k != "seq"}, r"missing key\(s\) \['seq'\]"),
    (lambda d: d | {"layer_styles": {"first": {}}}, r"layer index like '0'"),
])
def test_from_dict_is_strict(mutate, message):
    with pytest.raises(PlanError, match=message):
        RunSpec.from_dict(mutate(megatron().to_dict()))


@pytest.mark.parametrize("kw, message", [
    ({"styles": {"attn.qproj": "colwise"}}, r"unknown module key 'attn.qproj'.*Did you mean attn.q_proj"),
    ({"styles": {"attn.o_proj": "colwise"}}, r"attn.o_proj='colwise' is not allowed; use one of replicate, rowwise"),
    ({"styles": {"mlp.experts": "colwise"}}, r"experts are cut by ep_axes"),
    ({"styles": {"attn.q_proj": "colwise"}}, r"attention block mixes replicated and tensor-parallel"),
    ({"layer_styles": {0: {"embed": "rowwise"}}}, r"unknown module key 'embed'"),
    ({"tp_axis": "model"}, r"axis 'model' is not in the mesh"),
    ({"dp_axes": ("tp",)}, r"axis 'tp' has several roles"),
    ({"dp_axes": ()}, r"axis 'dp' \(size 2\) has no role"),
    ({"ep_axes": "tp"}, r"ep_axes includes the tp_axis 'tp', which needs sequence_parallel"),
    ({"ep_axes": ("dp", "dp")}, r"ep_axes repeats an axis"),
    ({"ep_axes": "model"}, r"ep_axes: axis 'model' is not in the mesh"),
    ({"sequence_parallel": True, "styles": MLP_TP}, r"sequence_parallel needs every attention block"),
    ({"microbatches": 2}, r"microbatches=2 needs pp_axis"),
    ({"global_batch": 3}, r"global_batch=3 must be a multiple of the batch cut 2"),
    ({"sequence_parallel": True, "seq": 15}, r"seq=15 must be a multiple of the tp size 2"),
    ({"mesh": {"dp": 2, "tp": 0}}, r"axis 'tp' size must be a positive integer"),
    ({"global_batch": 0}, r"global_batch must be a positive integer, got 0"),
])
def test_refused_when_built(kw, message):
    with pytest.raises(PlanError, match=message):
        megatron(**kw)


def test_experts_fold_over_tp_and_dp():
    """MoE parallel folding (issue 13): experts cut over the tp axis and the dp axes at once,
    flattened in mesh order, with the MoE layers on the sequence shards."""
    spec = RunSpec(mesh={"dp": 2, "tp": 2}, tp_axis="tp", dp_axes=("dp",), styles=ATTN_TP | VOCAB_TP,
                   sequence_parallel=True, ep_axes=("tp", "dp"))
    assert spec.ep_axes == ("dp", "tp") and spec.ep_size == 4
    assert RunSpec.from_dict(spec.to_dict()) == spec
    check_fits(spec, MIXTRAL, 4)


@pytest.mark.parametrize("pc, axes", [
    (dict(tp=2, dp=2, ep=4, sp=True), ("dp", "tp")),
    (dict(tp=2, dp=2, ep=2, sp=True), ("tp",)),
    (dict(tp=1, dp=4, ep=4), ("dp",)),
    (dict(tp=2, dp=1, ep=2, sp=True), ("tp",)),
    (dict(tp=2, dp=2, ep=1, sp=True), ()),
])
def test_plan_to_spec_folds_experts_as_megatron_orders_ranks(pc, axes):
    """EP takes the tensor-parallel ranks first, then the data-parallel ones (megatron.assign_axes)."""
    from symtensor.runtime.lower import plan_to_spec

    spec = plan_to_spec(local_plan(MIXTRAL, global_batch=8, seq=16, **pc))
    role = {"tp": spec.tp_axis, "dp": (spec.dp_axes + spec.fsdp_axes + (None,))[0]}
    assert spec.ep_axes == tuple(role[a] for a in axes)


@pytest.mark.parametrize("pc, mesh, roles", [
    (dict(tp=2, dp=2, sp=True), {"loopback0": 2, "loopback1": 2}, ("loopback1", ("loopback0",), None)),
    (dict(tp=2, dp=4, sp=True), {"loopback0+loopback1": 4, "loopback2": 2},
     ("loopback2", ("loopback0+loopback1",), None)),
    (dict(dp=4), {"loopback0+loopback1": 4}, (None, ("loopback0+loopback1",), None)),
    (dict(pp=2, dp=2, micro_batch=1), {"loopback0": 2, "loopback1": 2}, (None, ("loopback1",), "loopback0")),
])
def test_plan_to_spec_names_the_plans_mesh_axes(pc, mesh, roles):
    """One mesh vocabulary (issue 24): the RunSpec's axes are the plan's (``loopback0`` on this
    machine's processes), those of one role joined by "+" as the runtime flattens them; tp on the
    innermost axes, pp on the outermost, as the plan's layouts put them."""
    from symtensor.runtime.lower import plan_to_spec

    plan = local_plan(LLAMA, global_batch=8, seq=16, **pc)
    spec = plan_to_spec(plan)
    assert dict(spec.mesh) == mesh and (spec.tp_axis, spec.dp_axes, spec.pp_axis) == roles
    named = {a for cuts in plan.layouts.values() for axes in cuts.values() for a in axes} | set(plan.pipeline.names)
    assert {a for axis, _ in spec.mesh for a in axis.split("+")} == named


@pytest.mark.parametrize("pc, message", [
    (dict(tp=2, dp=2, ep=2, etp=2, sp=True), r"no expert tensor parallelism; plan with etp=1"),
    (dict(tp=2, dp=4, ep=4, sp=True), r"cuts experts over whole mesh axes: ep must be one of \[2, 8\]"),
    (dict(tp=2, dp=2, ep=4, sp=False), r"MoE layers with tensor parallelism under sequence parallelism only"),
])
def test_plan_to_spec_refuses_expert_grids_it_cannot_run(pc, message):
    from symtensor.runtime.lower import plan_to_spec

    plan = local_plan(MIXTRAL, global_batch=8, seq=16, **pc)
    with pytest.raises(PlanError, match=message):
        plan_to_spec(plan)


def test_style_without_tp_axis():
    with pytest.raises(PlanError, match="needs tp_axis"):
        RunSpec(mesh={"dp": 2}, dp_axes=("dp",), styles=VOCAB_TP)


@pytest.mark.parametrize("kw, message", [
    ({"microbatches": 1}, r"microbatches=1 must be >= the 2 pipeline stages"),
    ({"pp_schedule": "zb"}, r"pp_schedule='zb'; use one of 1f1b, gpipe"),
    ({"mesh": {"pp": 2, "tp": 2}, "tp_axis": "tp"}, r"pipeline parallel combines only with dp_axes"),
])
def test_pipeline_refusals(kw, message):
    with pytest.raises(PlanError, match=message):
        RunSpec(**({"mesh": {"pp": 2}, "pp_axis": "pp", "microbatches": 2} | kw))


@pytest.mark.parametrize("spec, cfg, world, message", [
    (megatron(), LLAMA, 2, r"has 4 devices but the run has world size 2"),
    (RunSpec(mesh={"tp": 3}, tp_axis="tp", styles=ATTN_TP, global_batch=3), LLAMA, 3,
     r"heads=4 is not divisible by the tp size 3"),
    (RunSpec(mesh={"tp": 4}, tp_axis="tp", styles=ATTN_TP), LLAMA, 4, r"kv_heads=2 is not divisible by the tp size 4"),
    (RunSpec(mesh={"tp": 3}, tp_axis="tp", styles=MLP_TP, global_batch=3), LLAMA, 3,
     r"ffn=128 is not divisible by the tp size 3"),
    (RunSpec(mesh={"dp": 3}, dp_axes=("dp",), ep_axes="dp", global_batch=3), MIXTRAL, 3,
     r"experts=4 is not divisible by the ep size 3"),
    (RunSpec(mesh={"dp": 2}, dp_axes=("dp",), ep_axes="dp"), LLAMA, 2, r"has no experts"),
    (megatron(styles=ATTN_TP | VOCAB_TP, sequence_parallel=True), LLAMA, 4,
     r"sequence_parallel needs the MLP of every dense layer tensor parallel \(layer 0 of tiny-llama"),
    (megatron(styles=ATTN_TP | MLP_TP), MIXTRAL, 4, r"layer 0 of tiny-mixtral is a mixture of experts"),
    (megatron(layer_styles={5: ATTN_TP}), LLAMA, 4, r"layer 5 does not exist; model tiny-llama has layers 0..1"),
    (RunSpec(mesh={"pp": 3}, pp_axis="pp", microbatches=3, global_batch=3), LLAMA, 3,
     r"layers=2 is not divisible by the pp size 3"),
])
def test_check_fits(spec, cfg, world, message):
    with pytest.raises(PlanError, match=message):
        check_fits(spec, cfg, world)


def test_run_spec_refuses_before_launching(monkeypatch):
    """A spec that does not match the process count or the model never starts torchrun."""
    def no_launch(*args, **kwargs):
        raise AssertionError("torchrun was started for a refused spec")

    monkeypatch.setattr(launch.subprocess, "run", no_launch)
    with pytest.raises(PlanError, match=r"has 4 devices but the run has world size 2; make the product"):
        launch.run_spec("tiny-llama", megatron(), nproc=2)
    with pytest.raises(PlanError, match=r"kv_heads=2 is not divisible by the tp size 4"):
        launch.run_spec("tiny-llama", RunSpec(mesh={"tp": 4}, tp_axis="tp", styles=ATTN_TP).to_dict(), nproc=4)
    with pytest.raises(PlanError, match=r"experts=4 is not divisible by the ep size 3"):
        launch.run_spec("tiny-mixtral", RunSpec(mesh={"dp": 3}, dp_axes=("dp",), ep_axes="dp", global_batch=3),
                        nproc=3)
    with pytest.raises(PlanError, match=r"optimizer 'lbfgs'"):
        launch.run_spec("tiny-llama", megatron(), optimizer="lbfgs", nproc=4)


@pytest.mark.parametrize("framework, zero, axes, reshard, gathers", [
    ("megatron", 0, (("dp",), ()), True, 0),
    ("fsdp2", 1, ((), ("dp",)), False, 1),   # FSDP2 has no ZeRO-1: it runs as ZeRO-2, the same collectives
    ("fsdp2", 2, ((), ("dp",)), False, 1),
    ("fsdp2", 3, ((), ("dp",)), True, 2),
    ("megatron", 3, ((), ("dp",)), True, 2),
])
def test_plan_to_spec_runs_each_zero_stage_as_the_plan_costs_it(framework, zero, axes, reshard, gathers):
    """The fsdp2 engine costs ZeRO 1/2 as FSDP2 without resharding after forward (every parameter
    gathered once per step), ZeRO 3 with it (twice); the runtime refused ZeRO 1/2 and always
    resharded. Its spec now gathers as many times as the prediction it is judged against."""
    from symtensor.runtime.lower import plan_to_spec
    from symtensor.runtime.verify import predicted_bytes

    plan = local_plan(LLAMA, dp=2, zero=zero, micro_batch=4, global_batch=8, seq=16, framework=framework)
    spec = plan_to_spec(plan)
    named = tuple(tuple(plan.mesh.names) if a else () for a in axes)  # the plan's one axis, loopback0
    assert ((spec.dp_axes, spec.fsdp_axes), spec.reshard_after_forward) == (named, reshard)
    predicted = predicted_bytes(plan)
    reduced = predicted["reduce_scatter"] or predicted["all_reduce"]
    assert predicted["all_gather"] == gathers * reduced and reduced > 0


@pytest.mark.parametrize("zero", [1, 2])
def test_plan_to_spec_still_refuses_megatrons_zero_1_and_2(zero):
    """Megatron's distributed optimizer (replicated parameters, one gather after the step) is no
    FSDP2: its ZeRO-1/2 plans stay refused, naming the engine and the fix."""
    from symtensor.runtime.lower import plan_to_spec

    plan = local_plan(LLAMA, dp=2, zero=zero, micro_batch=4, global_batch=8, seq=16)
    with pytest.raises(PlanError, match=rf"not megatron's ZeRO-{zero}; plan with --framework fsdp2 or --zero 3"):
        plan_to_spec(plan)


def test_reshard_after_forward_is_fully_shards_setting():
    spec = RunSpec(mesh={"dp": 2}, fsdp_axes=("dp",), reshard_after_forward=False)
    assert RunSpec.from_dict(spec.to_dict()) == spec and spec.to_dict()["reshard_after_forward"] is False
    assert RunSpec(mesh={"dp": 2}, fsdp_axes=("dp",)).reshard_after_forward  # ZeRO-3 by default
    with pytest.raises(PlanError, match=r"reshard_after_forward=False needs fsdp_axes"):
        RunSpec(mesh={"dp": 2}, dp_axes=("dp",), reshard_after_forward=False)
    with pytest.raises(PlanError, match=r"reshard_after_forward must be true or false, got 'no'"):
        RunSpec(mesh={"dp": 2}, fsdp_axes=("dp",), reshard_after_forward="no")


def test_the_runtime_chooses_zero_2_under_the_fsdp2_engine():
    """``symtensor run`` asked for ZeRO-2 costs and runs it as the fsdp2 engine (it was refused)."""
    from symtensor.runtime.lower import plan_to_spec
    from symtensor.runtime.verify import choose_plan

    plan = choose_plan(LLAMA, 2, 8, 16, 1, 2, None)
    assert (plan.parallelism.dp, plan.train.zero, plan.engine) == (2, 2, "fsdp2")
    assert plan_to_spec(plan).reshard_after_forward is False
