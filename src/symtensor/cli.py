"""The command line: a thin layer over ``symtensor.api``.

    symtensor models | clusters
    symtensor graph MODEL [--json]
    symtensor evaluate MODEL --cluster C (--nodes N | --devices N) --tp T --pp P ... [--json]
    symtensor plan MODEL --cluster C (--nodes N | --devices N) [--json] [--out plan.json]
    symtensor calibrate [--fit] [--json]
    symtensor calibrate --runs my_runs.csv --out cluster.yaml [--cluster BASE]   # fit to your own runs
    symtensor profile [--devices N] [--backend nccl|gloo] [--quick] --out cluster.yaml [--force]
    symtensor clusters --show cluster.yaml | calibrate --cluster cluster.yaml   # a profiled file
    symtensor explain PLAN [--op NAME] [--candidates] [--formula] [--json]
    symtensor compare A B [--json]              # plan files, or a plan file and a baseline name
    symtensor sweep MODEL --cluster C --devices N --seq 2048..131072 [--json]
    symtensor report MODEL --cluster C --devices N [--sweep seq=A..B] --html out.html

Every user error prints one line (``error: ...``) and exits with status 2; ``--debug`` shows the
traceback instead.
"""

from __future__ import annotations

import argparse
import json
import sys

from symtensor.errors import PlanError

DEFAULT_MODEL, DEFAULT_CLUSTER, DEFAULT_DEVICES = "llama3-8b", "dgx-h100", 64


def _model_args(p: argparse.ArgumentParser, model_required=True) -> None:
    if model_required:
        p.add_argument("model", help="a preset (symtensor models) or a Hugging Face config.json")
    else:
        p.add_argument("model", nargs="?", default=DEFAULT_MODEL, help=f"default {DEFAULT_MODEL}")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a model field")
    p.add_argument("--seq", type=int, help="tokens per sequence (default: the model's context, at most 8192)")
    p.add_argument("--global-batch", type=int, help="sequences per step (default: about 4M tokens)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _cluster_args(p: argparse.ArgumentParser, required=True) -> None:
    p.add_argument("--cluster", default=None if required else DEFAULT_CLUSTER, required=required,
                   help="preset (symtensor clusters) or a YAML/JSON cluster file")
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument("--nodes", type=int)
    g.add_argument("--devices", type=int)


def _framework_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--framework", default="megatron",
                   choices=("megatron", "fsdp2", "deepspeed", "megatron-deepspeed"),
                   help="the engine whose semantics the costs follow (overlap, gathers, buckets); default megatron")


def _moe_args(p: argparse.ArgumentParser) -> None:
    """The facts of the user's stack (cost.stack.Stack; each option's destination is its field, ``stack_of``): how
    the MoE layers run (cost.moe), the gradient reduction's dtype, the allocator's expandable segments."""
    p.add_argument("--moe-dispatcher", default="alltoall", choices=("alltoall", "deepep", "hybridep"),
                   help="MoE token dispatcher: alltoall (NCCL all-to-all of top_k copies; Megatron's alltoall, "
                   "torchtitan's), deepep (DeepEP normal kernels: once per node over RDMA, NVLink forwarding; "
                   "Megatron's flex dispatcher) or hybridep (NVIDIA's HybridEP, the same route at its measured "
                   "rates; Megatron's --moe-flex-dispatcher-backend hybridep); default alltoall")
    p.add_argument("--moe-routing", default="balanced", choices=("balanced", "aux_loss"),
                   help="balanced: every expert rank at the mean (Megatron's --moe-router-force-load-balancing); "
                   "aux_loss: the most-loaded rank of the EP group paces the step; default balanced")
    p.add_argument("--moe-capacity-factor", type=float, metavar="F", help="experts drop tokens beyond F x their "
                   "mean (Megatron's --moe-expert-capacity-factor); default: dropless")
    p.add_argument("--moe-shared-overlap", action="store_true", help="the shared expert runs beside the dispatch "
                   "and combine all-to-alls (Megatron's --moe-shared-expert-overlap)")
    p.add_argument("--moe-ep-overlap", action="store_true", help="one micro-batch's dispatch and combine beside "
                   "another's compute in the 1F1B steady state (Megatron's --overlap-moe-expert-parallel-comm "
                   "--delay-wgrad-compute)")
    p.add_argument("--grad-reduce-in-bf16", dest="grad_reduce_bf16", action="store_true",
                   help="gradients reduced in bf16 instead of fp32 (Megatron's --grad-reduce-in-bf16: a bf16 "
                   "gradient buffer; torchtitan's mixed_precision_reduce bfloat16 under FSDP)")
    p.add_argument("--expandable-segments", action=argparse.BooleanOptionalAction, default=None,
                   help="PyTorch's caching allocator with expandable segments (PYTORCH_CUDA_ALLOC_CONF="
                   "expandable_segments:True; the reserved memory's fragmentation) or, with --no-, without; "
                   "default: as the engine's stack launches it (torchtitan's run_train.sh sets it)")
    p.add_argument("--cpu-offload-layers", dest="cpu_offload_layers", type=int, default=0, metavar="N",
                   help="Megatron-LM's CPU activation offloading (--cpu-offloading-num-layers N): the first N "
                   "transformer layers' saved activations go to host memory in forward and come back in backward "
                   "over the device's host link (PCIe, NVLink-C2C); Megatron only, without pipeline parallelism or "
                   "recomputation; default 0 (none)")
    p.add_argument("--offload-modules", dest="offload_modules", type=_module_list, default=(), metavar="M,M",
                   help="Megatron-core's fine-grained activation offloading (--fine-grained-activation-offloading "
                   "--offload-modules M ...): each named module's input activation goes to host memory in forward "
                   "and comes back before its backward, in every layer; M of attn_norm, qkv_linear, core_attn, "
                   "attn_proj, mlp_norm, expert_fc1, moe_act; Megatron only, not with --cpu-offload-layers; "
                   "default: none")
    p.add_argument("--fp8-param-gather", "--fp4-param-gather", dest="fp8_param_gather", action="store_true",
                   help="Megatron-LM's --fp8-param-gather (--fp4-param-gather under --precision fp4): the layers' "
                   "GEMM weights kept as Transformer Engine FP8 (NVFP4) tensors, no BF16 copy, gathered in those "
                   "bytes; needs --precision fp8 or fp4 and ZeRO >= 1 (fp4: ZeRO 1); Megatron only")
    p.add_argument("--first-last-layers-bf16", dest="bf16_layers", type=_bf16_layers, default=(0, 0), metavar="N,M",
                   help="Megatron-LM's --first-last-layers-bf16 --num-layers-at-start-in-bf16 N "
                   "--num-layers-at-end-in-bf16 M: the first N and last M transformer layers' GEMMs in BF16 under "
                   "--precision fp8 (not delayed scaling) or fp4; Megatron only; default 0,0 (none)")
    p.add_argument("--loss", default=None, metavar="KERNEL",
                   help="the loss kernel your stack runs over the vocabulary: fused (one kernel each way, Transformer "
                   "Engine's parallel cross-entropy), vocab-parallel (Megatron-LM without "
                   "--cross-entropy-loss-fusion), "
                   "fp32 (PyTorch's cross-entropy on an fp32 copy: torchtitan), bf16 (on the bf16 logits: NeMo "
                   "AutoModel's fp32_upcast false); default: the engine's own")
    p.add_argument("--elementwise", default=None, metavar="KERNELS",
                   help="the norms', RoPE's and SwiGLU's kernels your stack runs: eager (PyTorch composites, "
                   "torchtitan without torch.compile) or fused (Transformer Engine's modules, torch.compile); "
                   "default: the engine's own")
    p.add_argument("--attention", default=None, metavar="KERNEL",
                   help="the attention kernel your stack runs: te (Transformer Engine's: cuDNN on Hopper; NeMo "
                   "AutoModel's attn te), sdpa (PyTorch's, as torch >= 2.11 and torchtitan run it: cuDNN on Hopper "
                   "and Blackwell, FlashAttention-2 elsewhere), fa2 (FlashAttention-2: flash-attn, or SDPA on torch "
                   "<= 2.10), fa3 (FlashAttention-3, Hopper); default: the engine's own")
    p.add_argument("--tp-comm-overlap", dest="tp_comm_overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="Megatron's --tp-comm-overlap (tensor-parallel communication behind the GEMMs, with "
                   "sequence parallelism) or, with --no-, exposed: Megatron-LM's default; default: the engine's (on)")
    p.add_argument("--dp-comm-overlap", dest="dp_comm_overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="Megatron's --overlap-grad-reduce and --overlap-param-gather or, with --no-, the gradient "
                   "reduction after backward and the parameter gather before forward: Megatron-LM's defaults; "
                   "default: the engine's (on)")
    p.add_argument("--cp-comm-type", dest="cp_comm", choices=("p2p", "a2a"), default=None,
                   help="how context parallelism runs (Megatron-LM's --cp-comm-type): p2p, ring attention (Megatron's "
                   "and torchtitan's default), or a2a, all-to-alls around an attention core cut by heads "
                   "(DeepSpeed-Ulysses' scheme, DeepSpeed's only); default: the engine's own")
    p.add_argument("--pp-schedules", dest="pp_schedules", type=int, default=1, metavar="K",
                   help="gradient accumulation as K pipeline schedules per step, each of the step's micro-batches / K, "
                   "each filling and draining the pipeline (torchtitan and NeMo AutoModel with a local batch below "
                   "the step's); fsdp2 only; default 1 (one schedule: Megatron's, and what the exports launch)")
    p.add_argument("--param-dtype", dest="param_dtype", default=None, metavar="DTYPE",
                   help="the dtype your parameters are kept and updated in: fp32 (a master copy: Megatron, "
                   "torchtitan) or bf16 (no fp32 copy, bf16 gradients and Adam moments: NeMo AutoModel's MoE models; "
                   "fsdp2 only); default: the engine's own")


def _precision_args(p: argparse.ArgumentParser, auto: bool = True) -> None:
    """--precision and --fp8-recipe (cost.precision)."""
    p.add_argument("--precision", default=None if auto else "bf16", choices=("bf16", "fp8", "fp16", "fp4"),
                   help="the layers' linear GEMMs in BF16 or FP8 (attention, norms, embedding and LM head stay BF16), "
                        "or fp16: the model in FP16 with dynamic loss scaling (--framework megatron-deepspeed), or "
                        "fp4: those GEMMs in NVFP4 on Blackwell (Transformer Engine, --framework megatron; only where "
                        "asked for); "
                        + ("default: the search chooses FP8 where the device has it and it wins" if auto
                           else "default bf16"))
    p.add_argument("--fp8-recipe", default=None, choices=("delayed", "tensorwise", "blockwise", "mxfp8", "nvfp4"),
                   help="scaling recipe as Megatron-LM's --fp8-recipe (or, for nvfp4 under --precision fp4, "
                        "--fp4-recipe) names it; default: mxfp8 on Blackwell, delayed elsewhere; nvfp4 under fp4")


def _search_args(p: argparse.ArgumentParser) -> None:
    """The options of a plan search, shared by plan, sweep and report."""
    p.add_argument("--micro-batch", type=_micro, default="auto")
    p.add_argument("--space", default="symtensor", choices=("symtensor", "megatron"))


def _bf16_layers(value: str) -> tuple[int, int]:
    """N,M of --first-last-layers-bf16: two layer counts >= 0."""
    parts = value.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"--first-last-layers-bf16 takes N,M (the first N and last M layers kept in "
                                         f"BF16, counts >= 0), got {value!r}")
    return int(parts[0]), int(parts[1])


def _module_list(value: str) -> tuple[str, ...]:
    """M,M of --offload-modules: the names (checked by ``cost.stack.Stack``)."""
    return tuple(m.strip() for m in value.split(",") if m.strip())


def _micro(value: str):
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--micro-batch must be an integer or auto, got {value!r}") from None


def _recompute(value: str) -> str:
    from symtensor.cost.train import recompute_refusal

    why = recompute_refusal(value)
    if why is not None:
        raise argparse.ArgumentTypeError("invalid choice: " + why.split("=", 1)[1])
    return value


class _Parser(argparse.ArgumentParser):
    """argparse with the project's error format: one line, exit status 2 (not usage + message)."""

    def error(self, message):
        from symtensor.output import printable

        self.exit(2, f"error: {printable(message)}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="symtensor", description="Symbolic and adaptive tensor partitioning planner")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("models", help="list the model zoo").add_argument("--json", action="store_true")
    p = sub.add_parser("clusters", help="list the cluster presets, or show a cluster file (--show FILE)")
    p.add_argument("--show", metavar="FILE", help="a cluster file, e.g. written by symtensor profile")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("graph", help="parameters, operators, FLOPs and activations of a model")
    _model_args(p)
    p.add_argument("--micro-batch", type=int, default=1)
    p = sub.add_parser("evaluate", help="cost a Megatron-style configuration")
    _model_args(p)
    _cluster_args(p)
    for name in ("tp", "pp", "cp", "vpp"):
        p.add_argument(f"--{name}", type=int, default=1)
    p.add_argument("--ep", type=int, default=1, help="expert-parallel degree (MoE): folded over the tp x cp x dp "
                   "ranks of a stage, so it may exceed dp (Megatron's --expert-model-parallel-size)")
    p.add_argument("--etp", type=int, default=1, help="expert tensor-parallel degree (MoE; default 1, as Megatron's "
                   "MoE model zoo runs experts; Megatron's --expert-tensor-parallel-size)")
    p.add_argument("--dp", type=int, help="default: devices / (tp*pp*cp)")
    p.add_argument("--sp", dest="sp", action="store_true", default=None, help="sequence parallel (default with tp>1)")
    p.add_argument("--no-sp", dest="sp", action="store_false")
    p.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3))
    p.add_argument("--dp-shard", type=int, help="hybrid sharding (HSDP): ZeRO shards over the innermost N ranks of "
                   "dp x cp (one node first) and replicates across the rest (torchtitan's data_parallel_shard_degree, "
                   "Megatron's --num-distributed-optimizer-instances dp*cp/N); default: the whole group")
    p.add_argument("--recompute", default="none", type=_recompute,
                   metavar="{none,selective,full,selective-op,layer:N,modules:M,M}",
                   help="recomputation: none, selective (Megatron's: the attention core), full (every layer), "
                        "torchtitan's selective checkpointing: selective-op (its per-op policy) or layer:N (every "
                        "N-th layer whole), or Megatron's --recompute-modules as modules:M,M (core_attn, moe_act, "
                        "layernorm, mla_up_proj, mlp, moe, shared_experts; e.g. modules:layernorm,moe_act)")
    p.add_argument("--micro-batch", type=_micro, default="auto")
    p.add_argument("--pp-layout", metavar="LAYOUT", help="the layers over the pipeline stages: Megatron's "
                   "--pipeline-model-parallel-layout string ('Et*3|(tt|)*29,|L': its stages give vpp), FIRST,LAST "
                   "layers of the first and last stages (--decoder-first/last-pipeline-num-layers), 'even' "
                   "(Megatron's split without one) or 'balanced'; default: the balanced split where it beats "
                   "Megatron's own (the output says so)")
    _framework_arg(p)
    _precision_args(p, auto=False)
    _moe_args(p)
    p = sub.add_parser("plan", help="search the best plan (default: LLaMA-3-8B on 64 H100)")
    _model_args(p, model_required=False)
    _cluster_args(p, required=False)
    _search_args(p)
    p.add_argument("--no-baselines", action="store_true", help="skip the baselines (the Megatron grid is costed "
                                                                 "anyway: the plan is never worse than its best)")
    _framework_arg(p)
    _precision_args(p)
    _moe_args(p)
    p.add_argument("--out", help="write the plan file (read by export, run, explain)")
    p.add_argument("--force", action="store_true", help="write --out through a symbolic link")
    p.add_argument("--capture", action="store_true",
                   help="plan the model's own PyTorch forward (Hugging Face, captured with torch.export on fake "
                        "tensors) instead of the built-in graph")
    p.add_argument("--torch", metavar="MODULE:FACTORY",
                   help="plan an unmodified PyTorch model: FACTORY() returns (a Hugging Face style module, example "
                        "inputs); it is captured with torch.export on fake tensors")
    p = sub.add_parser("explain", help="why a plan: per layer type and mesh axis, the candidates and their costs")
    p.add_argument("plan", help="a plan file (symtensor plan ... --out plan.json)")
    p.add_argument("--op", help="an op (layers.1.q_proj) or op position (q_proj): every candidate's terms")
    p.add_argument("--candidates", action="store_true", help="every candidate's terms for every layer type")
    p.add_argument("--formula", action="store_true", help="the symbolic formulas of the chosen layouts' terms")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p = sub.add_parser("compare", help="two plans, or a plan and a baseline: differences and what they cost")
    for side in ("a", "b"):
        p.add_argument(side, help="a plan file, or a baseline: megatron_recipe, megatron_grid_best, fsdp, drec")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    _precision_args(p, auto=False)
    p = sub.add_parser("sweep", help="plans across a range of seq, devices or global batch; breakpoints explained")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL, help=f"default {DEFAULT_MODEL}")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a model field")
    p.add_argument("--cluster", default=DEFAULT_CLUSTER, help="preset (symtensor clusters) or a cluster file")
    for flag in ("--seq", "--devices", "--nodes", "--global-batch"):
        p.add_argument(flag, help="N, or a range: A..B (doubling), A..B:F (times F), A,B,C")
    _search_args(p)
    _precision_args(p)
    _moe_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (points, breakpoints)")
    p = sub.add_parser("report", help="one self-contained HTML page with the plan's plots and tables")
    _model_args(p, model_required=False)
    _cluster_args(p, required=False)
    _search_args(p)
    p.add_argument("--html", default="report.html", help="the page to write (default report.html)")
    p.add_argument("--force", action="store_true", help="write --html through a symbolic link")
    p.add_argument("--sweep", help="PARAM=RANGE for the sweep curves (default seq from half to twice the plan's); "
                                   "none to skip")
    p = sub.add_parser("export", help="a plan file as Megatron-LM arguments, a torchtitan config or a DTensor plan")
    p.add_argument("plan", help="a plan file (symtensor plan --out)")
    p.add_argument("--to", required=True, choices=("megatron", "torchtitan", "dtensor", "megatron-deepspeed"))
    p = sub.add_parser("run", help="run a plan under torchrun (gloo on CPU): numerics and bytes vs the model")
    p.add_argument("model", help="a small model preset (tiny-llama, tiny-mixtral) or config.json")
    p.add_argument("--devices", type=int, required=True, help="processes")
    p.add_argument("--device", default="cpu", help="cpu (gloo processes; numerics checked) or cuda (this machine's "
                                                     "GPUs, NCCL: step time and peak memory vs the prediction)")
    p.add_argument("--cluster",
                   help="with --device cuda: the preset or cluster file to predict on (default: this GPU's)")
    p.add_argument("--plan", help="a plan file (symtensor plan --out); default: the fastest runnable configuration")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--optimizer", default="sgd", choices=("sgd", "adamw"))
    p.add_argument("--tp", type=int, help="tensor-parallel degree (default: what the model predicts fastest)")
    p.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3),
                   help="0: all-reduce; 1, 2: FSDP2 without resharding after forward (costed under the fsdp2 "
                        "engine; FSDP2 has no ZeRO-1, so 1 runs as 2); 3: FSDP")
    p.add_argument("--dp-shard", type=int, help="hybrid sharding (HSDP, fully_shard on a 2-D mesh): FSDP shards "
                   "over the innermost N processes of dp and replicates across the rest (needs --zero 1, 2 or 3)")
    p.add_argument("--ep", type=int, help="expert-parallel degree (MoE, expert TP 1): folded over whole mesh "
                   "axes, so tp, tp x dp, or dp when tp is 1")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (the runtime pipelines data-parallel stages)")
    p.add_argument("--attention-only-tp", action="store_true",
                   help="a heterogeneous plan: attention tensor-parallel, every other op data-parallel")
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--timeout", type=float, default=300,
                   help="seconds a process may go without progress before the run is stopped (default 300)")
    p.add_argument("--master-port", type=int,
                   help="the rendezvous port on 127.0.0.1 (default: a free port the system picks)")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("calibrate", help="predicted vs published measurements (calibration.csv)")
    p.add_argument("--fit", action="store_true", help="refit the end-to-end constants first (kernel rates are "
                   "measured tables, never fitted)")
    p.add_argument("--cluster", metavar="FILE", help="a profiled cluster file: its curves vs its measurements; with "
                   "--runs, the cluster the fit refines (default: the runs' own)")
    p.add_argument("--runs", metavar="CSV", help="your measured runs (one row per run: model, cluster, devices, the "
                   "evaluate options, step_time_s, optional peak_memory_gib): fit the end-to-end constants to them")
    p.add_argument("--out", metavar="FILE", help="with --runs: the fitted cluster file to write (YAML)")
    p.add_argument("--constants", metavar="A,B", help="with --runs: the constants to fit (default: all of "
                   "step_s, microbatch_s, kernel_gap_s, comm_sm_fraction, expert_s, link, link_gather)")
    p.add_argument("--force", action="store_true", help="with --runs: overwrite --out")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("profile", help="measure this machine's GEMM, attention, memory and collective curves "
                                       "into a cluster file")
    p.add_argument("--out", required=True, help="the cluster file to write (YAML)")
    p.add_argument("--devices", type=int, help="processes (default: every GPU with nccl, 2 with gloo); 1 measures "
                                               "the kernels alone and keeps the links of its preset (or --like)")
    p.add_argument("--backend", help="nccl (GPUs) or gloo (CPU processes); default nccl where there are GPUs")
    p.add_argument("--quick", action="store_true", help="a few points per curve (under a minute)")
    p.add_argument("--force", action="store_true", help="overwrite --out")
    p.add_argument("--like", metavar="PRESET", help="keep this preset's published peaks (default: by device name)")
    p.add_argument("--ranks-per-node", type=int, help="group ranks into nodes of this many (default: one node)")
    p.add_argument("--json", action="store_true")
    return ap


def main(argv=None) -> int:
    from symtensor import validate
    from symtensor.output import printable

    args = build_parser().parse_args(argv)
    try:
        validate.cli_args(args)
        return _dispatch(args)
    except PlanError as exc:
        if args.debug:
            raise
        print(f"error: {printable(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("error: interrupted", file=sys.stderr)
        return 130


def _dispatch(args) -> int:
    from symtensor import report

    if args.command == "calibrate" and args.runs:
        return _calibrate_runs(args)
    if args.command == "profile" or getattr(args, "show", None) or getattr(args, "cluster", None) and \
            args.command == "calibrate":
        return _dispatch_profile(args)
    if args.command == "models":
        from symtensor.models import PRESETS

        return report.models(PRESETS, args.json)
    if args.command == "clusters":
        from symtensor.hardware import PRESETS

        return report.clusters(PRESETS, args.json)
    if args.command == "calibrate":
        from symtensor import calibration

        e2e = calibration.fit_end_to_end() if args.fit else None
        results = calibration.predict(e2e=e2e)
        loso = calibration.loso()
        extra = {"end_to_end": (e2e or calibration.shipped_end_to_end()).as_dict(),
                 "in_sample": calibration.error_by_regime(results),
                 "leave_one_source_out": calibration.error_by_regime(loso),
                 "band_coverage": {k: list(v) for k, v in calibration.band_coverage(loso).items()}}
        code = report.calibration(results, calibration.summary(results), args.json, extra)
        return code if not calibration.outside(results) else 1
    from symtensor import api
    from symtensor.plan.document import evaluation_json

    if args.command == "graph":
        out = api.graph_summary(args.model, micro_batch=args.micro_batch, seq=args.seq,
                                global_batch=args.global_batch, overrides=args.set)
        return report.graph(out, args.json)
    if args.command == "evaluate":
        out = api.evaluate(args.model, args.cluster, devices=args.devices, nodes=args.nodes, tp=args.tp, pp=args.pp,
                           dp=args.dp, cp=args.cp, ep=args.ep, etp=args.etp, sp=args.sp, zero=args.zero,
                           dp_shard=args.dp_shard, recompute=args.recompute,
                           micro_batch=args.micro_batch, global_batch=args.global_batch, seq=args.seq, vpp=args.vpp,
                           overrides=args.set, framework=args.framework, precision=args.precision,
                           fp8_recipe=args.fp8_recipe, pp_layout=args.pp_layout, stack=stack_of(args))
        return report.evaluation(evaluation_json(out), args.json)
    if args.command == "plan":
        return _plan(args)
    if args.command in ("explain", "compare", "sweep", "report"):
        return _dispatch_analysis(args)
    if args.command == "export":
        from symtensor.export import engine_note, export
        from symtensor.plan import load_plan

        plan = load_plan(args.plan)
        out = export(plan, args.to)
        lines = isinstance(out, list)  # argument lines (Megatron-LM); a dict carries its note as _engine_note
        print(" \\\n  ".join(out) if lines else json.dumps(out, indent=2))
        note = engine_note(plan, args.to)
        if note and lines:
            print(f"note: {note}", file=sys.stderr)
        return 0
    if args.command == "run":
        from symtensor.runtime.verify import run

        out = run(args.model, args.devices, steps=args.steps, optimizer=args.optimizer, global_batch=args.global_batch,
                  seq=args.seq, tp=args.tp, zero=args.zero, ep=args.ep, pp=args.pp, plan_file=args.plan,
                  dp_shard=args.dp_shard,
                  attention_only=args.attention_only_tp, timeout_s=args.timeout, master_port=args.master_port,
                  device=args.device, cluster=args.cluster)
        report.run(out, args.json)
        return 0 if args.device == "cuda" or (out["numerics_ok"] and out["bytes_ok"]) else 1
    raise AssertionError(args.command)


def stack_of(args):
    """The facts of the user's stack that ``args`` state (``cost.stack.Stack``: the options of ``_moe_args``, whose
    destinations are its fields), for evaluate, plan and sweep."""
    from symtensor.cost.stack import KEYS, Stack

    return Stack(**{k: getattr(args, k) for k in KEYS})


def _plan(args) -> int:
    """symtensor plan: search, the baselines beside it, the JSON, the plan file."""
    from symtensor import api, report
    from symtensor.plan import save_plan
    from symtensor.plan.document import plan_json

    devices = DEFAULT_DEVICES if args.devices is None and args.nodes is None else args.devices
    with _busy("searching the plan and the baselines"):
        plan, base = api.plan_with_baselines(
            args.model, args.cluster, devices=devices, nodes=args.nodes, micro_batch=args.micro_batch,
            global_batch=args.global_batch, seq=args.seq, space=args.space, overrides=args.set, capture=args.capture,
            torch=args.torch, framework=args.framework, names=() if args.no_baselines else None,
            precision=args.precision, fp8_recipe=args.fp8_recipe, stack=stack_of(args))
        base = base or None
    out = plan_json(plan, base, space=args.space, captured=bool(args.capture or args.torch))
    if args.out:
        save_plan(plan, args.out)
        out["plan_file"] = args.out
    return report.plan(out, args.json)


def _dispatch_analysis(args) -> int:
    from symtensor import api
    from symtensor.report import console

    if args.command == "explain":
        out = api.explain(args.plan, op=args.op, formulas=args.formula)
        return console.explain(out, args.json, full=args.candidates or args.op is not None)
    if args.command == "compare":
        precision = None if args.precision == "bf16" else args.precision
        return console.compare(api.compare(args.a, args.b, precision, args.fp8_recipe), args.json)
    devices = DEFAULT_DEVICES if args.devices is None and args.nodes is None else args.devices
    with console.sweep_progress(sys.stderr.isatty()) as on_point:
        if args.command == "sweep":
            out = api.sweep(args.model, args.cluster, devices=devices, nodes=args.nodes, seq=args.seq,
                            global_batch=args.global_batch, micro_batch=args.micro_batch, space=args.space,
                            overrides=args.set, on_point=on_point, precision=args.precision,
                            fp8_recipe=args.fp8_recipe, stack=stack_of(args))
            return console.sweep(out, args.json)
        out = api.report(args.model, args.cluster, devices=devices, nodes=args.nodes, micro_batch=args.micro_batch,
                         global_batch=args.global_batch, seq=args.seq, space=args.space, overrides=args.set,
                         html=args.html, sweep_spec=args.sweep, on_point=on_point)
    return console.html_report(out, args.json)


def _calibrate_runs(args) -> int:
    """calibrate --runs CSV --out FILE [--cluster BASE]: fit the end-to-end constants to the user's runs."""
    import datetime

    from symtensor.profile import own_runs
    from symtensor.report.console import own_runs as show

    if not args.out:
        raise PlanError("calibrate --runs needs --out cluster.yaml: the fitted cluster file every command then takes")
    if args.fit:
        raise PlanError("--fit refits the shipped tables; --runs fits your own runs: give one of them")
    own_runs.check_writable(args.out, args.force)
    runs = own_runs.read_runs(args.runs)
    base = args.cluster or runs[0].cluster
    names = tuple(n.strip() for n in args.constants.split(",")) if args.constants else None
    fitted = own_runs.fit(runs, args.cluster, names)
    source = (f"symtensor calibrate --runs {args.runs} ({len(runs)} runs, {datetime.date.today().isoformat()}) "
              f"on {base}")
    path = own_runs.write(fitted, base, args.out, source, args.force)
    return show(fitted, str(path), args.json)


def _dispatch_profile(args) -> int:
    """profile, clusters --show FILE, calibrate --cluster FILE."""
    from symtensor import profile
    from symtensor.report import profile_view

    if args.command == "clusters":
        return profile_view.cluster_file(profile.read(args.show), args.json)
    if args.command == "calibrate":
        return profile_view.cluster_fit(args.cluster, profile.curves(args.cluster), args.json)
    with profile_view.progress(sys.stderr.isatty()) as on_step:
        out = profile.profile(args.out, devices=args.devices, backend=args.backend, quick=args.quick,
                              force=args.force, like=args.like, ranks_per_node=args.ranks_per_node, on_step=on_step)
    return profile_view.profiled(out, args.json)


def _busy(what: str):
    """A spinner on stderr while a search runs (only on a terminal)."""
    import contextlib

    if not sys.stderr.isatty():
        return contextlib.nullcontext()
    from rich.console import Console

    return Console(stderr=True).status(what)


if __name__ == "__main__":
    sys.exit(main())
