"""What the exports share: the configuration an engine runs as one, the nearest exportable plan,
the commands that name a configuration, the model's architecture as the Megatron-lineage launchers
spell it (``ModelFlags``), and the notes.

A SymTensor plan is per-op; an engine takes one configuration for the whole model. A plan exports
when its ops agree on one (``Plan.parallelism``: not heterogeneous), that configuration passes the
one configuration rule (``plan.parallelism.refusal``, what the engines assert at launch) and the
engine's own capability table (its lowering module's ``refusal``); otherwise the export refuses
in one line, naming what differs or the rule, and the nearest exportable plan (``nearest``): it
never writes a configuration that would fail at launch.
"""

from __future__ import annotations

from dataclasses import dataclass

from symtensor.cost.engine import ENGINES, engine_named
from symtensor.cost.pipeline import layout_string
from symtensor.errors import PlanError
from symtensor.plan.parallelism import DEFAULT_FRAMEWORK, Capabilities, Heterogeneous, Parallelism
from symtensor.plan.summary import repeated_work
from symtensor.search.megatron import check_config, configuration, grid_points


def lowered(plan, caps: Capabilities) -> Parallelism:
    """The plan's configuration when it is one that passes the configuration rule; otherwise a
    one-line PlanError naming the reason and the nearest exportable plan. The engine's own rules
    are its lowering module's ``refusal``."""
    try:
        p = plan.parallelism
    except Heterogeneous as exc:
        differs = exc.differs
        more = f" (and {len(differs) - 1} more)" if len(differs) > 1 else ""
        raise PlanError(f"{caps.name} takes one configuration for every layer, but this plan is heterogeneous: "
                        f"{differs[0]}{more}; {nearest(plan)}") from None
    why = p.refusal(plan.model, plan.cluster.n_devices)
    if why is not None:
        raise PlanError(f"{caps.name} would refuse this plan at launch: {why}; {nearest(plan)}")
    if p.cp > 1 and p.train.context == "a2a" and not caps.a2a:
        raise PlanError(f"{caps.name} runs ring context parallelism, and this plan's runs as all-to-alls "
                        f"(DeepSpeed-Ulysses' scheme: the attention cut by heads) as the {p.framework} engine costs "
                        f"it; export it to megatron (--cp-comm-type a2a), or plan under --framework {caps.engine}"
                        + ("" if engine_named(p.framework).a2a_only else " with --cp-comm-type p2p"))
    if p.stack.cpu_offload_layers and not ENGINES[caps.engine].cpu_offload:  # (Megatron-LM's: cost.engine.CPU_OFFLOAD)
        raise PlanError(f"{caps.name} has no CPU activation offloading (Megatron-LM's --cpu-offloading-num-layers) "
                        "as this plan is costed; export it to megatron, or plan without --cpu-offload-layers")
    if p.stack.offload_modules and not ENGINES[caps.engine].cpu_offload:  # (Megatron-core's: cost.offload)
        raise PlanError(f"{caps.name} has no fine-grained activation offloading (Megatron-core's --offload-modules) "
                        "as this plan is costed; export it to megatron, or plan without --offload-modules")
    if p.stack.low_precision and ENGINES[caps.engine].refuses_feature("lowp"):
        raise PlanError(f"{caps.name} has no quantized parameters or BF16-kept layers as this plan is costed "
                        "(Megatron-LM's --fp8-param-gather, --first-last-layers-bf16); export it to megatron, or plan "
                        "without them")
    if p.precision not in caps.precision:
        raise PlanError(f"{caps.name} does not run {p.precision} as this plan is costed ({p.framework}'s "
                        f"{p.precision} path); plan with --precision {caps.precision[0]}, or export it to "
                        f"{'megatron-deepspeed' if p.precision == 'fp16' else 'megatron'}")
    return p


def evaluate_command(plan, p: Parallelism) -> str:
    """The ``symtensor evaluate`` command of configuration ``p`` on the plan's model and cluster."""
    cl = plan.cluster
    flags = " ".join(f"--{k} {getattr(p, k)}" for k in ("tp", "pp", "dp", "cp", "ep", "etp", "zero", "micro_batch",
                                                         "global_batch", "seq", "vpp"))
    flags = flags.replace("_", "-") + (" --sp" if p.sp else "") + f" --recompute {p.recompute}"
    flags += f" --framework {p.framework}" if p.framework != DEFAULT_FRAMEWORK else ""
    flags += f" --precision fp8 --fp8-recipe {p.fp8_recipe}" if p.precision == "fp8" else ""
    flags += " --precision fp4" if p.precision == "fp4" else ""
    flags += " --precision fp16" if p.precision == "fp16" else ""
    flags += f" --dp-shard {p.dp_shard}" if p.hsdp else ""
    flags += f" --pp-layout '{layout_string(p.layer_split)}'" if p.layer_split is not None else ""
    flags += "".join(f" {flag}" for flag in stack_flags(p.stack))
    return f"symtensor evaluate {model_arg(plan.model)} --cluster {cl.name} --devices {cl.n_devices} {flags}"


# the symtensor evaluate option of a stack fact whose option is not its own name (cli._moe_args)
_STACK_FLAGS = {"grad_reduce_bf16": "--grad-reduce-in-bf16", "bf16_layers": "--first-last-layers-bf16"}


def stack_flags(stack) -> list[str]:
    """The ``symtensor evaluate`` options that state ``stack``'s facts (``cost.stack.Stack``) where they differ from
    its defaults, in the CLI's spelling (tests/unit/test_export.py parses them back to the same Stack)."""
    out = []
    for key, value in stack.differing().items():
        flag = _STACK_FLAGS.get(key, "--" + key.replace("_", "-"))
        if key == "expandable_segments":
            out.append(flag if value else "--no-expandable-segments")
        elif isinstance(value, bool):
            out.append(flag)
        elif isinstance(value, tuple):
            out.append(f"{flag} {','.join(str(v) for v in value)}")
        else:
            out.append(f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}")
    return out


def nearest(plan) -> str:
    """The nearest exportable plan, as the command that finds it: the Megatron space at the plan's
    global batch, or else at the least larger one that has a Megatron configuration (first the
    batch that lets data parallelism use every device, when devices repeat work)."""
    cl, gb, repeat = plan.cluster, plan.train.global_batch, repeated_work(plan)
    framework = f" --framework {plan.engine}" if plan.engine != DEFAULT_FRAMEWORK else ""
    command = (f"symtensor plan {model_arg(plan.model)} --cluster {cl.name} --devices {cl.n_devices} "
               f"--seq {plan.seq}{framework}")
    tail = f" (--global-batch {repeat[2]} lets every device take its own share)" if repeat else ""
    batches = [gb] + ([repeat[2]] if repeat else []) + [gb * k for k in (2, 3, 4, 6, 8, 12, 16)]
    for batch in dict.fromkeys(batches):
        if _megatron_runs(plan, batch):
            return (f"the nearest exportable plan: {command} --global-batch {batch} --space megatron"
                    + (tail if batch == gb else ""))
    return (f"no Megatron configuration runs {plan.model.name} on {cl.n_devices} devices at a global batch of "
            f"{gb} to {16 * gb}; change the device count or the global batch{tail}")


def _megatron_runs(plan, global_batch: int) -> bool:
    """Whether some Megatron configuration (``search.megatron.grid_points``, validated) runs the
    plan's model on its cluster at ``global_batch``."""
    cfg, cl = plan.model, plan.cluster
    node = cl.levels[0].fanout or cl.n_devices
    for point in grid_points(cfg, cl.n_devices, node, global_batch, plan.seq):
        try:
            check_config(cfg, cl.n_devices, configuration(point))
        except PlanError:
            continue
        return True
    return False


def model_arg(cfg) -> str:
    """The model as ``symtensor plan`` takes it: its preset (with the ``--set`` overrides that
    make it this model), or the config file it came from."""
    from dataclasses import fields

    from symtensor.models import PRESETS

    preset = PRESETS.get(cfg.name)
    if preset is None:
        return cfg.source if cfg.source.endswith(".json") else cfg.name
    changed = []
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if f.compare and value != getattr(preset, f.name):
            shown = ",".join(map(str, value)) if isinstance(value, tuple) else value  # as --set parses it
            changed.append(f"--set {f.name}={shown}")
    return " ".join([cfg.name] + changed)


@dataclass(frozen=True)
class ModelFlags:
    """How a Megatron-lineage launcher spells the model's architecture (its megatron/training/arguments.py):
    the values of ``--normalization`` per ``ModelConfig.norm``, the rotary position embedding flag, the
    grouped-query attention flags (formatted with the KV head count), whether it takes ``--add-qkv-bias``, and the
    flags of a squared-ReLU MLP, a zero-centred LayerNorm gamma and a partial rotation ("": the launcher has none)."""

    norms: dict
    rope: str
    query_groups: tuple[str, ...]
    qkv_bias: bool
    squared_relu: str = ""
    layernorm_1p: str = ""
    rotary_percent: str = ""


# NVIDIA/Megatron-LM (``--normalization``'s choices, ``--position-embedding-type``, ``--group-query-attention``)
# (NVIDIA/Megatron-LM@d98e8a64dd: ``--normalization`` LayerNorm | RMSNorm, ``--squared-relu``, ``--rotary-percent``
# in megatron/training/arguments.py; ``--apply-layernorm-1p``, TransformerConfig.layernorm_zero_centered_gamma)
MEGATRON_LM = ModelFlags(norms={"rmsnorm": "RMSNorm", "layernorm": "LayerNorm", "layernorm1p": "LayerNorm"},
                         rope="--position-embedding-type rope",
                         query_groups=("--group-query-attention", "--num-query-groups {}"), qkv_bias=True,
                         squared_relu="--squared-relu", layernorm_1p="--apply-layernorm-1p",
                         rotary_percent="--rotary-percent {}")
# microsoft/Megatron-DeepSpeed@f4157be megatron/arguments.py (``--num-key-value-heads``; no --add-qkv-bias; its
# LLaMA path is RMSNorm and SwiGLU only)
MEGATRON_DEEPSPEED = ModelFlags(norms={"rmsnorm": "rmsnorm"}, rope="--use-rotary-position-embeddings",
                                query_groups=("--num-key-value-heads {}",), qkv_bias=False)


def size_args(cfg) -> list[str]:
    """The model's sizes: layers, hidden width, attention heads, MLP width (both launchers spell them alike)."""
    return [f"--num-layers {cfg.layers}", f"--hidden-size {cfg.hidden}", f"--num-attention-heads {cfg.heads}",
            f"--ffn-hidden-size {cfg.ffn}"]


def query_group_args(cfg, flags: ModelFlags) -> list[str]:
    """Grouped-query attention: the KV head count where it differs from the query heads."""
    return [f.format(cfg.kv_heads) for f in flags.query_groups] if cfg.kv_heads != cfg.heads else []


def family_args(cfg, flags: ModelFlags, launcher: str) -> list[str]:
    """The LLaMA family's architecture as the model states it (its norm and MLP: RMSNorm and SwiGLU for LLaMA,
    LayerNorm-1p and squared ReLU for Nemotron; rotary embeddings, partial where it says so; untied output;
    biases), or a one-line refusal where ``launcher`` has no flag for a part of it."""
    if cfg.family != "llama":
        return []
    mlp = {"swiglu": "--swiglu", "relu2": flags.squared_relu, "gelu": None}[cfg.mlp]
    missing = []
    if cfg.norm not in flags.norms:
        missing.append(f"a {cfg.norm} norm")
    elif cfg.norm == "layernorm1p" and not flags.layernorm_1p:
        missing.append("a zero-centred LayerNorm gamma")
    if mlp == "":
        missing.append("a squared-ReLU MLP")
    if cfg.rotary_percent != 1 and not flags.rotary_percent:
        missing.append(f"RoPE over {cfg.rotary_percent:g} of each head")
    if missing:
        raise PlanError(f"{launcher} cannot build {cfg.name} ({', '.join(missing)}): export it with --to megatron")
    args = [f"--normalization {flags.norms[cfg.norm]}", *([mlp] if mlp else []), flags.rope,
            "--untie-embeddings-and-output-weights"]
    args += [flags.layernorm_1p] if cfg.norm == "layernorm1p" else []
    args += [flags.rotary_percent.format(f"{cfg.rotary_percent:g}")] if cfg.rotary_percent != 1 else []
    args += ["--add-qkv-bias"] if flags.qkv_bias and cfg.qkv_bias and not cfg.bias else []
    return args + ([] if cfg.bias else ["--disable-bias-linear"])


def zero1_note(engine: str, setting: str) -> str:
    """The note of a ZeRO-1 plan run as FSDP2 without resharding after forward (ZeRO-2)."""
    return (f"{engine} has no ZeRO-1: this plan runs as FSDP2 with {setting}, which shards the gradients too "
            "(ZeRO-2); under the fsdp2 engine that is the same collectives and no more memory than the plan "
            "predicts (--zero 2 costs it)")


def engine_note(plan, caps: Capabilities, to: str) -> str | None:
    """A note when the plan was costed under another engine than the one format ``to`` runs."""
    want, got = caps.engine, plan.engine
    if want == got:
        return None
    return (f"this plan was costed with {got} semantics; {to} runs {want}: its step time may differ, re-plan "
            f"with --framework {want} for a prediction of that run")
