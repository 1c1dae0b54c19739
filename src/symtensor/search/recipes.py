"""The published Megatron-Bridge and NeMo training recipes of the zoo's models: the Megatron baseline.

"Faster than the Megatron recipe" compares a plan with the configuration users copy, so the
``megatron_recipe`` baseline (``search.baselines``) is the published recipe of the model where
one exists: its TP/PP/VPP/CP/EP/ETP, sequence parallelism, recomputation, precision and micro
batch, with the data-parallel degree scaled to the cluster (dp = devices / (tp x pp x cp)) at the
plan's global batch. Each row below cites the function that states it and the commit it was read
at; ``python benchmarks/recipes_table.py`` writes the table as ``benchmarks/results/recipes.md``.

Two kinds of rows, both NVIDIA's:
- ``pretrain``: the library recipes users start from (Megatron-Bridge
  ``src/megatron/bridge/recipes/<family>/h100/*.py``, each family's default ``<model>_pretrain_config``
  aliased to one of them; NeMo 2 ``nemo/collections/llm/recipes/*.py`` for Mixtral and Nemotron-4
  (``pretrain_recipe``'s defaults; the GPU count is its num_nodes x num_gpus_per_node) and the NeMo
  Framework Launcher's ``launcher_scripts/conf/training/llama/*.yaml`` for Llama 2 13B and 70B,
  which Megatron-Bridge does not ship). Written for H100 (the GPU count in the name).
- ``performance``: the benchmark configurations NVIDIA publishes throughput for, per GPU
  (Megatron-Bridge ``src/megatron/bridge/perf_recipes/<family>/<gpu>/*.py``; NeMo 2
  ``scripts/performance/recommended_model_configs/model_configs_<gpu>.csv`` for Mixtral and
  Nemotron-4, whose launch sets sequence parallelism where tp > 1: ``scripts/performance/helpers.py``
  ``set_primary_perf_configs``). Only
  those whose degrees differ from the library recipe's, or that are written for another GPU or
  sequence length, are rows.

Which row a cluster gets (``candidates``, best first): the library recipes, and the benchmark
configurations of the cluster's GPU (``gpu_of``; one measured on another GPU is not a recipe for
this one); a row written for the cluster's GPU first, then one written for the sequence (the
nearest by ratio, the longer of two as near: it holds the shorter's activations), then a library
recipe before a benchmark configuration, then the GPU count nearest the cluster's, then the
family's default. ``search.baselines.megatron_recipe`` takes the first that runs on the cluster
(``scaled``: the device count allows its model-parallel degrees, ``plan.parallelism.refusal``
accepts it) if it fits; NVIDIA's sizing rule where none runs or it does not fit, and the plan's
note says which it used and why.

A row's ``precision`` is passed to the configuration as ``precision`` (``scaled``); every row
is a BF16 recipe (the FP8 variants are named in the notes).

- ``pp_layout``: a stated per-stage layer split: Megatron's ``--pipeline-model-parallel-layout``
  string, costed as stated (``layout_split``: ``cost.pipeline.parse_layout``, the layer split the
  configuration's ``layer_split`` carries), or ``account_for_embedding/loss_in_pipeline_split``,
  which the planner's own split already takes (``parallelism.pipeline_split`` "slots"). DeepSeek-V3's
  strings hold its multi-token-prediction layer (``m``), which the zoo's model does not have: its
  stage is costed without it (``MTP_NOTE``).
- ``recompute_detail``: Megatron's recomputation as the recipe words it. Since ``recompute``
  states Megatron's module lists (``modules:mla_up_proj,mlp``: ``cost.recompute``), it is costed
  as stated (before: as the planner's ``selective``, with a note).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from symtensor.cost.pipeline import parse_layout
from symtensor.cost.stack import Stack
from symtensor.errors import PlanError
from symtensor.models import PRESETS, ModelConfig
from symtensor.plan.parallelism import Parallelism, refusal

# the repositories and the commits the rows were read at (the newest stored snapshots)
BRIDGE = "NVIDIA-NeMo/Megatron-Bridge@067f987df03b"
NEMO = "NVIDIA/NeMo@8cfedd720346"
LAUNCHER = "NVIDIA/NeMo-Framework-Launcher@0446d2c06037"
_LIB = "src/megatron/bridge/recipes/"
_PERF = "src/megatron/bridge/perf_recipes/"
_NEMO_CSV = "scripts/performance/recommended_model_configs/model_configs_{}.csv"

# NeMo 2's performance CSVs turn CUDA graphs on for some rows (column cuda_graphs 1); the cost model does not tell
# them apart (its host time per micro-batch, cost.efficiency.END_TO_END, is the same with or without)
_CUDA_GRAPHS = "CUDA graphs on (cuda_graphs 1; not modelled)"
RULE = "sizing rule"  # what the baseline names when no recipe is used
MTP_NOTE = "its multi-token-prediction layer (m) not modelled: that stage costed without it"


@dataclass(frozen=True, slots=True, kw_only=True)
class Recipe:
    """One published recipe, in Megatron's terms.

    Attributes:
        model: the zoo preset (``symtensor models``) it trains.
        name: the recipe function (or CSV row) as NVIDIA names it.
        repo, path: where it is stated (``repo`` carries the commit it was read at).
        kind: ``pretrain`` (a library recipe) or ``performance`` (a benchmark configuration).
        gpu: the GPU it was written for (``h100``, ``b200``, ``gb200``); devices: how many.
        seq: sequence length; micro_batch, global_batch: sequences.
        tp, pp, vpp, cp, ep, etp, sp: its degrees (vpp 1 = no virtual stages).
        recompute: the recipe's recomputation as the planner states it (a module list is ``modules:M,M``,
            Megatron's --recompute-modules); recompute_detail: the recipe's own words.
        zero: 1 for Megatron's distributed optimizer (every row), 3 for Megatron FSDP.
        precision: the recipe's precision (the configuration's, ``scaled``).
        pp_layout: its stated pipeline layout, if any (``layout_split``; see the module docstring).
        default: the family's default (``<model>_pretrain_config`` is this function).
        notes: what the planner does not model of it.
        stack: the stack facts its launch states (``cost.stack.Stack``): Megatron-Bridge's performance recipes
            reduce gradients in bf16 and set ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` in their
            ``env_vars`` (all but one here: ``_PERF_STACK``), some turn on ``overlap_moe_expert_parallel_comm``;
            NeMo 2's performance launch (Mixtral, Nemotron-4) states the first two, the allocator setting but on B200
            (``_NEMO_PERF_STACK``); the library recipes state none. The recipe is costed with them on its own GPUs
            (``benchmarks/recipes_table.py``); as a baseline it runs the plan's stack, as every point of a search
            does.
    """

    model: str
    name: str
    repo: str
    path: str
    kind: str
    gpu: str
    devices: int
    seq: int
    tp: int
    pp: int
    cp: int = 1
    vpp: int = 1
    ep: int = 1
    etp: int = 1
    sp: bool = False
    recompute: str = "none"
    recompute_detail: str = "none"
    zero: int = 1
    precision: str = "bf16"
    pp_layout: str = ""
    micro_batch: int = 1
    global_batch: int = 512
    default: bool = False
    notes: str = ""
    stack: Stack = Stack()

    @property
    def source(self) -> str:
        """``repo:path`` (the repo with its commit)."""
        return f"{self.repo}:{self.path}"

    @property
    def cited(self) -> str:
        """How a plan names it: the recipe and its source."""
        return f"{self.name} ({self.source})"

    @property
    def layout_string(self) -> str | None:
        """Its Megatron ``--pipeline-model-parallel-layout`` string, None when it states none (or
        states the embedding and loss as layer slots, the planner's own rule)."""
        return self.pp_layout if self.pp_layout and self.pp_layout != _SLOTS else None

    @property
    def degrees(self) -> str:
        """Its degrees in one line, e.g. ``tp4 pp4 vpp5 cp2 sp``."""
        more = (("vpp", self.vpp), ("cp", self.cp), ("ep", self.ep), ("etp", self.etp))
        parts = [f"tp{self.tp}", f"pp{self.pp}"] + [f"{k}{v}" for k, v in more if v > 1]
        return " ".join(parts + (["sp"] if self.sp else []))


# What a Megatron-Bridge performance recipe states of its stack (NVIDIA-NeMo/Megatron-Bridge@067f987df03b
# src/megatron/bridge/perf_recipes/<family>/<gpu>/*.py): every one calls ``_benchmark_common`` (perf_recipes/
# _common.py: ``cfg.ddp.grad_reduce_in_fp32 = False``, gradients reduced in bf16) and sets
# "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True" in its ``cfg.env_vars``, but for
# llama3_70b_pretrain_64gpu_gb200_bf16_config (Megatron FSDP with CPU offloading: no allocator setting).
_PERF_STACK = Stack(expandable_segments=True, grad_reduce_bf16=True)
# ... and those that also set comm_overlap.overlap_moe_expert_parallel_comm (with delay_wgrad_compute): Qwen3-235B
# on 256 H100 (CommOverlapConfig(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True)) and GPT-OSS-120B
# on 64 GB200
_PERF_EP_OVERLAP = Stack(expandable_segments=True, grad_reduce_bf16=True, moe_ep_overlap=True)
# ... and those whose own function sets cfg.model.moe_token_dispatcher_type = "flex" with
# moe_flex_dispatcher_backend = "hybridep" (perf_recipes/qwen/{b200,gb200}/qwen3_moe.py: Qwen3-30B-A3B on 8 B200 and
# 8 GB200, Qwen3-235B-A22B on 256 GB200): NVIDIA's HybridEP dispatcher (``cost.moe``). Recipes that inherit the
# dispatcher from a library recipe keep all-to-all unless that recipe states otherwise.
_PERF_HYBRIDEP = Stack(expandable_segments=True, grad_reduce_bf16=True, moe_dispatcher="hybridep")

# What NeMo 2's performance launch states of its stack (NVIDIA/NeMo@8cfedd720346 scripts/performance/): each
# llm/pretrain_<model>.py builds the library recipe with performance_mode=True, whose pretrain_performance_optimizations
# sets trainer.plugins.grad_reduce_in_fp32 = False, as helpers.py set_precision_configs does for any compute dtype
# (gradients reduced in bf16); executors.py slurm_executor sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True on
# every GPU but B200 ("it causes an unexpected error"), where the allocator keeps its default. Stated on every
# row of those CSVs (Mixtral and Nemotron-4).
_NEMO_PERF_STACK = Stack(expandable_segments=True, grad_reduce_bf16=True)
_NEMO_PERF_STACK_B200 = Stack(grad_reduce_bf16=True)


def _bridge(model, name, path, gpu, devices, seq, tp, pp, **kw) -> Recipe:
    kind = "performance" if path.startswith(_PERF) else "pretrain"
    kw.setdefault("stack", _PERF_STACK if kind == "performance" else Stack())
    return Recipe(model=model, name=name, repo=BRIDGE, path=path, kind=kind, gpu=gpu, devices=devices, seq=seq, tp=tp,
                  pp=pp, **kw)


def _nemo_csv(model, gpu, devices, seq, tp, pp, **kw) -> Recipe:
    """A BF16 row of NeMo 2's performance CSV for ``gpu`` (``_NEMO_CSV``), with the stack its launch states on that GPU
    (``_NEMO_PERF_STACK``; B200 without expandable segments)."""
    return Recipe(model=model, name=f"pre_train {model.replace('-', ' ', 1)} {gpu} bf16", repo=NEMO,
                  path=_NEMO_CSV.format(gpu),
                  kind="performance", gpu=gpu, devices=devices, seq=seq, tp=tp, pp=pp,
                  stack=_NEMO_PERF_STACK_B200 if gpu == "b200" else _NEMO_PERF_STACK, **kw)


_LLAMA = _LIB + "llama/h100/llama3.py"
_QWEN3 = _LIB + "qwen/h100/qwen3_moe.py"
_DSV3 = _LIB + "deepseek/h100/deepseek_v3.py"
_SLOTS = "embedding and loss as layer slots (account_for_embedding/loss_in_pipeline_split)"
_FULL1 = "full, uniform, 1 layer per group"
_DSV3_16 = "Et*4|(t*4|)*14tmL"  # _get_deepseek_v3_pipeline_layout (16, 1) and (4, 4): 4 + 14 x 4 + 1 (+ MTP, loss)

RECIPES: tuple[Recipe, ...] = (
    # -- Megatron-Bridge library recipes (H100; the default alias of each family marked) --
    _bridge("llama2-7b", "llama2_7b_pretrain_2gpu_h100_bf16_config", _LIB + "llama/h100/llama2.py", "h100", 2, 4096,
            2, 1, default=True),
    _bridge("llama3-8b", "llama3_8b_pretrain_2gpu_h100_bf16_config", _LLAMA, "h100", 2, 8192, 1, 1, cp=2, default=True,
            notes="FP8 variants: llama3_8b_pretrain_2gpu_h100_fp8cs_config, _fp8mx_config (same degrees)"),
    _bridge("llama3-8b", "llama3_8b_pretrain_16gpu_h100_bf16_16k_config", _LLAMA, "h100", 16, 16384, 4, 2, cp=2,
            sp=True),
    _bridge("llama3-8b", "llama3_8b_pretrain_32gpu_h100_bf16_64k_config", _LLAMA, "h100", 32, 65536, 4, 2, cp=4,
            sp=True),
    _bridge("llama3-8b", "llama3_8b_pretrain_64gpu_h100_bf16_128k_config", _LLAMA, "h100", 64, 131072, 4, 2, cp=8,
            sp=True),
    _bridge("llama3-70b", "llama3_70b_pretrain_32gpu_h100_bf16_config", _LLAMA, "h100", 32, 8192, 4, 4, vpp=5, cp=2,
            sp=True, default=True),
    _bridge("llama3-70b", "llama3_70b_pretrain_32gpu_h100_bf16_16k_config", _LLAMA, "h100", 32, 16384, 8, 2, cp=2,
            sp=True),
    _bridge("llama3-70b", "llama3_70b_pretrain_256gpu_h100_bf16_64k_config", _LLAMA, "h100", 256, 65536, 8, 4, cp=8,
            sp=True),
    _bridge("llama3-405b", "llama31_405b_pretrain_256gpu_h100_bf16_config", _LLAMA, "h100", 256, 131072, 8, 8, vpp=2,
            cp=4, sp=True, pp_layout=_SLOTS, default=True),
    _bridge("qwen2-7b", "qwen2_7b_pretrain_2gpu_h100_bf16_config", _LIB + "qwen/h100/qwen2.py", "h100", 2, 4096, 2, 1,
            micro_batch=2, global_batch=32, default=True),
    _bridge("qwen2-72b", "qwen2_72b_pretrain_32gpu_h100_bf16_config", _LIB + "qwen/h100/qwen2.py", "h100", 32, 4096,
            8, 4, micro_batch=2, global_batch=32, default=True, notes="sequence parallelism off, as stated"),
    _bridge("qwen3-30b-a3b", "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", _QWEN3, "h100", 16, 4096, 1, 1, ep=16,
            global_batch=1024, default=True, stack=Stack(moe_dispatcher="hybridep"), notes="HybridEP flex dispatcher"),
    _bridge("qwen3-30b-a3b", "qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config", _QWEN3, "h100", 8, 4096, 4, 2, ep=4,
            sp=True, recompute="full", recompute_detail=_FULL1, micro_batch=2, global_batch=32),
    _bridge("qwen3-235b-a22b", "qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config", _QWEN3, "h100", 256, 4096, 4, 16,
            cp=2, ep=8, sp=True, pp_layout=_SLOTS, global_batch=32, default=True),
    _bridge("deepseek-v3", "deepseek_v3_pretrain_1024gpu_h100_bf16_config", _DSV3, "h100", 1024, 4096, 2, 16, ep=64,
            sp=True, pp_layout=_DSV3_16, global_batch=4096, default=True),
    _bridge("deepseek-v3", "deepseek_v3_pretrain_256gpu_h100_bf16_32nodes_config", _DSV3, "h100", 256, 4096, 2, 8,
            ep=32, sp=True, recompute="full", recompute_detail=_FULL1, pp_layout="Et*8|(t*8|)*6t*5mL",
            global_batch=4096),
    _bridge("gpt-oss-120b", "gpt_oss_120b_pretrain_64gpu_h100_bf16_config", _LIB + "gpt_oss/h100/gpt_oss.py", "h100",
            64, 4096, 2, 4, ep=16, sp=True, default=True),
    _bridge("gpt-oss-20b", "gpt_oss_20b_pretrain_16gpu_h100_bf16_config", _LIB + "gpt_oss/h100/gpt_oss.py", "h100",
            16, 4096, 2, 4, ep=4, sp=True, default=True),
    _bridge("gpt3-175b", "gpt3_175b_pretrain_32gpu_h100_bf16_config", _LIB + "gpt/h100/gpt3_175b.py", "h100", 32,
            2048, 4, 8, vpp=6, sp=True, micro_batch=2, global_batch=2048, default=True),
    # -- NeMo Framework Launcher (NeMo 1) recipes of Llama 2 13B and 70B (Megatron-Bridge has only 7B) --
    Recipe(model="llama2-13b", name="llama2_13b.yaml", repo=LAUNCHER,
           path="launcher_scripts/conf/training/llama/llama2_13b.yaml", kind="pretrain", gpu="h100", devices=256,
           seq=4096, tp=2, pp=1, sp=True, global_batch=2048, default=True),
    Recipe(model="llama2-70b", name="llama2_70b.yaml", repo=LAUNCHER,
           path="launcher_scripts/conf/training/llama/llama2_70b.yaml", kind="pretrain", gpu="h100", devices=1024,
           seq=4096, tp=4, pp=4, vpp=20, sp=True, global_batch=2048, default=True),
    # -- NeMo 2 library recipes (Megatron-Bridge has no Mixtral) --
    Recipe(model="mixtral-8x7b", name="mixtral_8x7b.pretrain_recipe", repo=NEMO,
           path="nemo/collections/llm/recipes/mixtral_8x7b.py", kind="pretrain", gpu="h100", devices=64, seq=4096,
           tp=1, pp=4, vpp=8, ep=8, default=True),
    Recipe(model="mixtral-8x22b", name="mixtral_8x22b.pretrain_recipe", repo=NEMO,
           path="nemo/collections/llm/recipes/mixtral_8x22b.py", kind="pretrain", gpu="h100", devices=128, seq=4096,
           tp=2, pp=4, vpp=14, cp=2, ep=8, etp=2, sp=True, default=True,
           notes="expert TP unset: Megatron-core's initialize_model_parallel defaults it to tp"),
    # -- NeMo 2 library recipes of Nemotron-4 (Megatron-Bridge has none: only its model bridge) --
    Recipe(model="nemotron4-15b", name="nemotron4_15b.pretrain_recipe", repo=NEMO,
           path="nemo/collections/llm/recipes/nemotron4_15b.py", kind="pretrain", gpu="h100", devices=8, seq=4096,
           tp=4, pp=1, sp=True, micro_batch=2, global_batch=32, default=True),
    Recipe(model="nemotron4-15b", name="nemotron4_15b_16k.pretrain_recipe", repo=NEMO,
           path="nemo/collections/llm/recipes/nemotron4_15b_16k.py", kind="pretrain", gpu="h100", devices=8,
           seq=16384, tp=2, pp=2, cp=2, sp=True, micro_batch=2, global_batch=32),
    Recipe(model="nemotron4-15b", name="nemotron4_15b_64k.pretrain_recipe", repo=NEMO,
           path="nemo/collections/llm/recipes/nemotron4_15b_64k.py", kind="pretrain", gpu="h100", devices=32,
           seq=65536, tp=4, pp=2, cp=4, sp=True, micro_batch=2, global_batch=32),
    Recipe(model="nemotron4-340b", name="nemotron4_340b.pretrain_recipe", repo=NEMO,
           path="nemo/collections/llm/recipes/nemotron4_340b.py", kind="pretrain", gpu="h100", devices=6144,
           seq=4096, tp=8, pp=12, vpp=8, cp=2, sp=True, global_batch=2304, default=True),
    # -- Megatron-Bridge performance recipes (BF16) whose degrees differ from the library's --
    _bridge("llama3-405b", "llama31_405b_pretrain_1024gpu_h100_bf16_config", _PERF + "llama/h100/llama31.py", "h100",
            1024, 8192, 8, 8, vpp=8, cp=2, sp=True, pp_layout=_SLOTS, global_batch=1536),
    _bridge("qwen3-235b-a22b", "qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config", _PERF + "qwen/h100/qwen3_moe.py",
            "h100", 256, 4096, 2, 8, vpp=4, ep=32, sp=True, pp_layout=_SLOTS, global_batch=8192,
            stack=_PERF_EP_OVERLAP),
    _bridge("deepseek-v3", "deepseek_v3_pretrain_1024gpu_h100_bf16_config", _PERF + "deepseek/h100/deepseek_v3.py",
            "h100", 1024, 4096, 2, 8, vpp=4, ep=64, sp=True, recompute="modules:mla_up_proj,mlp",
            recompute_detail="selective: mla_up_proj, mlp", pp_layout="Et|(tt|)*30mL", global_batch=16384),
    _bridge("gpt-oss-120b", "gpt_oss_120b_pretrain_64gpu_h100_bf16_config", _PERF + "gpt_oss/h100/gpt_oss.py", "h100",
            64, 4096, 1, 4, ep=8, recompute="modules:layernorm,moe_act",
            recompute_detail="selective: layernorm, moe_act", global_batch=1280),
    _bridge("llama3-8b", "llama3_8b_pretrain_8gpu_b200_bf16_config", _PERF + "llama/b200/llama3.py", "b200", 8, 8192, 1,
            1, micro_batch=2, global_batch=128),
    _bridge("llama3-70b", "llama3_70b_pretrain_64gpu_b200_bf16_config", _PERF + "llama/b200/llama3.py", "b200", 64,
            8192, 2, 4, vpp=5, cp=2, sp=True, global_batch=256),
    _bridge("llama3-405b", "llama31_405b_pretrain_128gpu_b200_bf16_config", _PERF + "llama/b200/llama31.py", "b200",
            128, 8192, 4, 16, vpp=8, sp=True, pp_layout=_SLOTS, global_batch=768),
    _bridge("qwen3-30b-a3b", "qwen3_30b_a3b_pretrain_8gpu_b200_bf16_config", _PERF + "qwen/b200/qwen3_moe.py", "b200",
            8, 4096, 1, 1, ep=8, micro_batch=4, global_batch=512, stack=_PERF_HYBRIDEP),
    _bridge("qwen3-235b-a22b", "qwen3_235b_a22b_pretrain_256gpu_b200_bf16_config", _PERF + "qwen/b200/qwen3_moe.py",
            "b200", 256, 4096, 1, 8, vpp=4, ep=8, pp_layout=_SLOTS, global_batch=8192),
    _bridge("deepseek-v3", "deepseek_v3_pretrain_256gpu_b200_bf16_config", _PERF + "deepseek/b200/deepseek_v3.py",
            "b200", 256, 4096, 1, 16, ep=8, recompute="modules:mla_up_proj",
            recompute_detail="selective: mla_up_proj", pp_layout=_DSV3_16, global_batch=4096),
    _bridge("gpt-oss-120b", "gpt_oss_120b_pretrain_64gpu_b200_bf16_config", _PERF + "gpt_oss/b200/gpt_oss.py", "b200",
            64, 4096, 1, 1, ep=8, recompute="modules:layernorm,moe_act",
            recompute_detail="selective: layernorm, moe_act", micro_batch=4, global_batch=1280),
    _bridge("llama3-8b", "llama3_8b_pretrain_8gpu_gb200_bf16_config", _PERF + "llama/gb200/llama3.py", "gb200", 8,
            8192, 1, 1, micro_batch=2, global_batch=128),
    _bridge("llama3-70b", "llama3_70b_pretrain_64gpu_gb200_bf16_config", _PERF + "llama/gb200/llama3.py", "gb200", 64,
            8192, 1, 1, zero=3, global_batch=256, stack=Stack(grad_reduce_bf16=True, cpu_offload_layers=20),
            notes="Megatron FSDP (optim_grads_params); cpu_offloading_num_layers=20 (activations only)"),
    _bridge("llama3-405b", "llama31_405b_pretrain_256gpu_gb200_bf16_config", _PERF + "llama/gb200/llama31.py",
            "gb200", 256, 8192, 4, 16, vpp=8, sp=True, pp_layout=_SLOTS, global_batch=1536),
    _bridge("qwen3-30b-a3b", "qwen3_30b_a3b_pretrain_8gpu_gb200_bf16_config", _PERF + "qwen/gb200/qwen3_moe.py",
            "gb200", 8, 4096, 1, 1, ep=8, micro_batch=4, global_batch=512, stack=_PERF_HYBRIDEP),
    _bridge("qwen3-235b-a22b", "qwen3_235b_a22b_pretrain_256gpu_gb200_bf16_config", _PERF + "qwen/gb200/qwen3_moe.py",
            "gb200", 256, 4096, 1, 8, ep=8, pp_layout=_SLOTS, global_batch=8192,
            stack=_PERF_HYBRIDEP),
    _bridge("deepseek-v3", "deepseek_v3_pretrain_256gpu_gb200_bf16_config", _PERF + "deepseek/gb200/deepseek_v3.py",
            "gb200", 256, 4096, 1, 4, vpp=4, ep=64, recompute="modules:mla_up_proj",
            recompute_detail="selective: mla_up_proj", pp_layout=_DSV3_16, global_batch=4096),
    _bridge("gpt-oss-120b", "gpt_oss_120b_pretrain_64gpu_gb200_bf16_config", _PERF + "gpt_oss/gb200/gpt_oss.py",
            "gb200", 64, 4096, 1, 1, ep=64, recompute="modules:layernorm,moe_act",
            recompute_detail="selective: layernorm, moe_act", micro_batch=4, global_batch=1280,
            stack=_PERF_EP_OVERLAP),
    # -- NeMo 2 performance configurations of Mixtral (BF16 rows of the CSVs) --
    _nemo_csv("mixtral-8x7b", "b200", 64, 4096, 1, 1, ep=8, micro_batch=2, global_batch=256),
    _nemo_csv("mixtral-8x7b", "gb200", 64, 4096, 1, 1, ep=8, micro_batch=2, global_batch=256),
    _nemo_csv("mixtral-8x22b", "h100", 256, 65536, 4, 4, vpp=14, cp=8, ep=8, sp=True, global_batch=256),
    _nemo_csv("mixtral-8x22b", "b200", 256, 65536, 2, 4, vpp=14, cp=8, ep=8, sp=True, global_batch=64),
    # -- NeMo 2 performance configurations of Nemotron-4 (BF16 rows of the CSVs; sequence parallelism where tp > 1,
    # as scripts/performance/helpers.py set_primary_perf_configs sets it) --
    _nemo_csv("nemotron4-15b", "h100", 64, 4096, 2, 1, sp=True, micro_batch=2, global_batch=256,
              notes="FP8 row: same degrees"),
    _nemo_csv("nemotron4-15b", "b200", 64, 4096, 1, 1, micro_batch=2, global_batch=256,
              notes=_CUDA_GRAPHS + "; FP8 row: same degrees"),
    _nemo_csv("nemotron4-15b", "gb200", 64, 4096, 1, 1, micro_batch=2, global_batch=256,
              notes=_CUDA_GRAPHS + "; FP8 row: same degrees"),
    _nemo_csv("nemotron4-340b", "h100", 256, 4096, 8, 8, vpp=12, sp=True, global_batch=64,
              notes="FP8 row: same degrees"),
    _nemo_csv("nemotron4-340b", "b200", 128, 4096, 8, 4, vpp=12, sp=True, global_batch=32,
              notes=_CUDA_GRAPHS + "; FP8 row: same degrees"),
    _nemo_csv("nemotron4-340b", "gb200", 128, 4096, 4, 8, vpp=12, sp=True, global_batch=32,
              notes="FP8 row: tp8 pp4 vpp12 with CUDA graphs"),
)


def gpu_of(device_name: str) -> str | None:
    """The recipes' GPU name of a cluster device (``Device.name``), None when NVIDIA writes none
    for it. H200 takes H100's recipes: NVIDIA publishes none for it, and it is an H100 with more
    and faster memory (the same SMs and clocks: NVIDIA H200 datasheet). Blackwell Ultra keeps its own
    name (``gb300``, ``b300``: a new die, not a B200), for which no benchmark row is copied here; the
    Ultra keys come first, and the Grace keys before the bare ones ("gb300-b300-288gb" holds "b300")."""
    name = device_name.lower()
    for key, gpu in (("gb300", "gb300"), ("b300", "b300"), ("gb200", "gb200"), ("b200", "b200"), ("h100", "h100"),
                     ("h200", "h100")):
        if key in name:
            return gpu
    return None


def published_model(cfg: ModelConfig) -> str | None:
    """Why ``cfg`` has no recipe (None when it may): a model that is not a zoo preset as
    published (a config.json, or a preset with overrides such as LoRA) is not what the recipes
    train."""
    preset = PRESETS.get(cfg.name)
    if preset is None:
        return f"{cfg.name} is not a zoo preset"
    if preset != cfg:
        return f"{cfg.name} differs from the preset the recipes train (overrides)"
    if not any(r.model == cfg.name for r in RECIPES):
        return f"no published recipe for {cfg.name}"
    return None


def candidates(model: str, device_name: str, seq: int, n_devices: int) -> list[Recipe]:
    """The recipes of ``model`` for a cluster of ``n_devices`` ``device_name`` devices at sequence
    ``seq``: the library recipes and the benchmark configurations of its GPU, best first (the
    order of the module docstring)."""
    gpu = gpu_of(device_name)

    def rank(r: Recipe):
        by_seq = (abs(math.log2(r.seq / seq)), r.seq < seq)
        return (r.gpu != gpu, by_seq, r.kind != "pretrain", abs(math.log2(r.devices / n_devices)), not r.default)

    return sorted((r for r in RECIPES if r.model == model and (r.kind == "pretrain" or r.gpu == gpu)), key=rank)


def layout_split(r: Recipe, cfg: ModelConfig) -> tuple[int, ...] | None:
    """The layers per virtual stage of ``r``'s stated layout string (``Recipe.layout_string``), None
    without one (Megatron's own split). The multi-token-prediction layer (``m``) is dropped: the
    zoo's models have none (``MTP_NOTE``). A PlanError when the string does not give the recipe's
    pp x vpp stages or the model's layers."""
    text = r.layout_string
    if text is None:
        return None
    split = parse_layout(text.replace("m", ""), r.pp, cfg.layers)
    if len(split) != r.pp * r.vpp:
        raise PlanError(f"pipeline layout {text!r} has {len(split)} stages, not pp x vpp = {r.pp} x {r.vpp}")
    return split


def scaled(r: Recipe, cfg: ModelConfig, n_devices: int, global_batch: int, seq: int) -> dict:
    """Recipe ``r`` on ``n_devices`` devices at the plan's global batch and sequence, as a Megatron
    configuration (``search.megatron``'s keys): its degrees, recomputation and micro batch, with
    dp = devices / (tp x pp x cp); the micro batch falls to 1 where the recipe's does not divide
    the batch of a replica, and the recipe's precision. A PlanError says why it does not run
    (``plan.parallelism.refusal``)."""
    model_parallel = r.tp * r.pp * r.cp
    if n_devices % model_parallel:
        raise PlanError(f"tp*pp*cp = {r.tp}*{r.pp}*{r.cp} = {model_parallel} does not divide {n_devices} devices")
    dp = n_devices // model_parallel
    mb = r.micro_batch if global_batch % (r.micro_batch * dp) == 0 else 1
    c = dict(tp=r.tp, pp=r.pp, dp=dp, cp=r.cp, ep=r.ep, etp=r.etp, sp=r.sp, zero=r.zero if dp * r.cp > 1 else 0,
             recompute=r.recompute, micro_batch=mb, global_batch=global_batch, seq=seq, vpp=r.vpp,
             precision=r.precision, layer_split=layout_split(r, cfg))
    why = refusal(Parallelism(**c), cfg, n_devices)
    if why is not None:
        raise PlanError(why)
    return c
