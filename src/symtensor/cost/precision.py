"""Training precision: BF16, or FP8 GEMMs under one of the engines' scaling recipes (issue 23, point 1).

Under FP8 the linear layers of the transformer layers run their three GEMMs (forward, input gradient,
weight gradient) on FP8 operands with BF16 outputs: Transformer Engine's ``Linear`` /
``LayerNormLinear`` / ``GroupedLinear`` under ``fp8_autocast`` (Megatron-LM ``--fp8-format hybrid``:
E4M3 forward, E5M2 gradients) and torchao's ``Float8Linear`` (torchtitan's ``float8`` converter).
What stays in BF16 (``fp8_gemm``): attention (the fused kernel's BMMs and softmax), norms and other
elementwise ops, the embedding, the LM head (Megatron's ``output_layer`` is not a Transformer Engine
module; torchtitan's converter skips ``output``) and the MoE router. Master weights, gradients and
optimizer state keep the engine's bytes (``Engine.state_bytes``).

Recipes, as Megatron-LM names them (``--fp8-recipe``, megatron/training/arguments.py; Transformer
Engine's docs, "Using FP8 with Transformer Engine" and transformer_engine/common/recipe):

    delayed     one scale per tensor from the amax history of earlier steps (``DelayedScaling``):
                the amax is reduced inside the cast kernel; the history is rolled every micro-batch
    tensorwise  one scale per tensor from this tensor's own amax (``Float8CurrentScaling``): an
                amax pass reads the tensor before the cast (torchao's dynamic tensorwise scaling too)
    blockwise   a scale per 1x128 tile of activations and gradients and per 128x128 block of weights
                (``Float8BlockScaling``; DeepSeek-V3, arXiv:2412.19437 section 3.3.2, and DeepGEMM's
                1x128 / 128x128 FP8 GEMMs): scales computed inside the cast, FP32 each
    mxfp8       a power-of-two (E8M0) scale per 32 consecutive elements (``MXFP8BlockScaling``, OCP
                Microscaling spec): Blackwell's Tensor Cores apply the scales (a device that lists an
                ``fp4`` peak has them: the MX formats came with the same Tensor Core generation)

Costs (``gemm_speedup``, ``cast_bytes``): an FP8 GEMM runs at the BF16 rate the cost model charges
times the measured FP8/BF16 ratio of its shape, (fp8 peak x FP8 table fraction) / (bf16 peak x BF16
table fraction) from ``cost.kernels``: whatever the BF16 rate carries beyond the kernel table (a
calibrated fraction: clocks, launch, power) carries over to FP8. Each FP8 GEMM also casts its
activation input forward and its output gradient backward: read BF16 (2 B), write an FP8 copy for the
GEMM and a transposed (column-wise) one for the other GEMM that reads it (1 + 1 B; Hopper's FP8 GEMMs
take only the TN layout, Transformer Engine's ``cast_transpose``), plus the recipe's scales; the
tensorwise recipe reads the tensor once more for its amax. Weights are cast once per step where the
engine caches them over micro-batches (Megatron-core passes Transformer Engine ``is_first_microbatch``:
GPT-3 175B at tp 4, pp 8 casts ~5.5 G weight elements x 4 B = 22 GB per step, ~8 ms of a 5.6 s step,
left out), and every micro-batch where it does not (torchao's ``Float8Linear`` under FSDP2: charged).

Memory (``weight_copy_bytes``, ``SAVED_FRACTION``): Transformer Engine keeps the FP8 weights and their
transposes between micro-batches (2 B per weight element besides the BF16 weight; the MX scales add
2/32 B); torchao casts them per forward (nothing resident). The GEMM inputs saved for the weight
gradient are their FP8 (column-wise) copies, half the BF16 bytes: Transformer Engine's ``Linear``
saves ``inputmat`` in FP8 under ``fp8_autocast``.

FP4 (``--precision fp4``, recipe ``nvfp4``; Megatron-LM ``--fp4-format e2m1 --fp4-recipe nvfp4``): Transformer
Engine's ``NVFP4BlockScaling`` (NVIDIA/TransformerEngine@d0067d0d transformer_engine/common/recipe/__init__.py;
docs/features/low_precision_training/nvfp4/nvfp4.rst; arXiv:2509.25149) on Blackwell's FP4 Tensor Cores. The
same GEMMs as FP8 run in FP4 (``fp8_gemm``: the layers' linear and expert GEMMs, forward, input gradient and
weight gradient; TE's Linear under ``fp8_autocast`` with the NVFP4 recipe); attention (``fp8_dpa`` False by
default), norms, the embedding, the LM head and the router stay BF16. E2M1 elements (0.5 B) with one E4M3 scale
per 16 elements (1x16 blocks for activations and gradients, 16x16 blocks for weights: the stored scales are
still one per 16 elements of each copy, ``scales`` shape [A, B/16]) and one FP32 scale per tensor from its amax:
an amax pass reads the tensor first (``nvte_hadamard_transform_amax`` takes the plain amax and the Hadamard-
transformed one in the same read), then the cast writes a row-wise copy and a transposed column-wise copy (NVFP4
GEMMs are TN only); the column-wise copies of the input and the output gradient (the weight gradient's operands)
pass a 16x16 random Hadamard transform inside the cast, gradients are stochastically rounded: per element 2 B
(amax) + 2 B (read) + 2 x (0.5 + 1/16) B (the copies), memory-bound time as FP8's casts. Megatron keeps whole
layers in BF16 only under ``--first-last-layers-bf16`` (default off; Megatron-Bridge's Llama 3 70B and 405B
NVFP4 performance recipes leave it off, its GPT-OSS and Nemotron 3 Super ones keep the last 4 and 14 layers):
a stack fact (``bf16_layers``, below).

Two stack facts of low-precision training (``cost.stack.Stack``), both Megatron-LM's (NVIDIA/Megatron-LM@d98e8a64dd):

    bf16_layers       ``--first-last-layers-bf16 --num-layers-at-start-in-bf16 N --num-layers-at-end-in-bf16 M``
                      (megatron/core/transformer/transformer_config.py; Megatron's counts default to 1 each under the
                      switch): ``fp8_utils.get_fp8_context`` / ``fp4_utils.get_fp4_context`` return a null context
                      for a global layer index < N or >= layers - M, so those transformer layers run every GEMM in
                      BF16 with no casts and save BF16 inputs, and under ``fp8_model_init`` (``is_init``) their
                      weights stay BF16 too. The cost model costs those layers' segments in BF16 on the stages that
                      hold them (``cost.model``). Refused: delayed scaling ("Delayed scaling does not support first
                      / last layer in BF16", TransformerConfig and get_fp8_context) and, under FP8, a count above
                      layers // pp (TransformerConfig).
    fp8_param_gather  ``--fp8-param-gather`` (``--fp4-param-gather`` under NVFP4): "Keep the compute param in fp8
                      (do not use any other intermediate dtype) and perform the param all-gather in fp8"
                      (megatron/training/arguments.py). The layers' GEMM weights are built as Transformer Engine
                      quantized tensors (``fp8_model_init``): no BF16 weight exists beside the quantized copies, which
                      the memory's ``fp8_weights`` term already holds (``lowp_weight_bytes``). Megatron-LM asserts
                      "--fp8-param-gather only supported with distributed optimizer, torch fsdp2, megatron fsdp"
                      (ZeRO >= 1 here), and fp8_param / fp4_param "must be used together with fp8 / fp4 mode".
                      What the data-parallel gather moves per weight element (``param_gather_bytes``):
                      - distributed optimizer (ZeRO 1): the parameter buffer is ``torch.uint8``
                        (distributed/param_and_grad_buffer.py ``group_params_for_buffers``) and holds each
                        quantized weight's row-wise data: 1 B per element (delayed, tensorwise, blockwise), NVFP4's
                        packed 0.5 B ("Param buffer (uint8): numel = N // 2"); scales are not gathered (each rank
                        derives them after an amax all-reduce, below). MXFP8 cannot map its tiles into that buffer
                        (TE ``replace_raw_data``: "not supported yet"), so its parameter all-gather runs in BF16
                        through the gradient buffer (``shared_buffer``, ``param_data`` its BF16 view;
                        ``--reuse-grad-buf-for-mxfp8-param-ag``, which arguments.py and Megatron-Bridge's
                        ``bf16_with_mxfp8_mixed`` set with it) and each rank quantizes the gathered weights
                        (``copy_tensors_to_quantized_params``): 2 B, the same as BF16.
                      - Megatron-FSDP (ZeRO 2, 3): the model-weight buffer is ``torch.uint8`` ("float8" groups,
                        distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py), plus a transpose buffer for
                        MXFP8 (``fp8_need_transpose_data``): 1 B, MXFP8 2 B. It has no NVFP4 path (no fp4 in its
                        buffers at this commit): FP4 with ZeRO 2/3 is refused.
                      The optimizer step casts its owned shard into the quantized weights
                      (distrib_optimizer.py ``_copy_main_params_to_model_params`` -> ``quantize_param_shard`` ->
                      TE ``quantize_master_weights``: ``master_weight.to(bf16)``, the amax of the shard unless
                      delayed scaling, then the cast): per owned element, beyond the BF16 write the default step
                      makes, a read of the BF16 copy (2 B), the amax read (2 B, not under delayed scaling) and the
                      quantized write (``param_cast_bytes``); MXFP8 under the distributed optimizer writes the BF16
                      copy only (``_copy_main_params_to_param_buffer``) and quantizes after the gather, as Transformer
                      Engine's first micro-batch cast of a BF16 weight does (left out in both: the module docstring).
                      Left out: the amax all-reduce over the data-parallel group (one FP32 per tensor; blockwise one
                      per 128x128 block, 1/4096 B per element; NVFP4 one per 16x16 block, 1/64 B) and the transposes
                      ``post_all_gather_processing`` builds after the gather (what TE's first micro-batch builds
                      without the fact, also left out).

The FP4 GEMM rate (``FP4_OVER_FP8``): an FP4 GEMM runs at the FP8 rate the cost model charges its shape
(``gemm_speedup``) times the device's FP4/FP8 peak ratio times the measured ratio of the two kernels' fractions
of their peaks. That ratio is Transformer Engine's own GEMM benchmark on B300 (docs/examples/gemm_profiling/
gemm_profiling.rst @d0067d0d, "Autocast vs Pre-quantized", ``--pre-quantize``: kernel time only, the casts
excluded as the cost model charges them apart): a 5B model's 12 layer GEMMs (M = 15,872 tokens, hidden 4,096,
MLP 16,384) took 7.161 ms per layer in MXFP8 and 3.764 ms in NVFP4, 1.90x, against B300's 13,125 / 4,500 = 2.92x
peak ratio (``hardware.cluster.B300_HGX``): the NVFP4 kernels reach 0.652 of the fraction of peak MXFP8's reach.
Other devices and shapes take that ratio of fractions as a stated transfer: no other FP4 GEMM measurement was
found (on B200 and GB200, whose FP4 peak is twice FP8's, FP4 GEMMs are charged 1.30x MXFP8's: likely low, since
B300 added FP4 Tensor Core throughput without more memory bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass

from symtensor.cost import kernels
from symtensor.cost.engine import ALIASES, ENGINES, engine_named, refusal as engine_refusal
from symtensor.errors import PlanError
from symtensor.hardware import PRESETS

# fp16: the whole model in FP16 with dynamic loss scaling (the engine's FP16 path, ``cost.engine.Engine.fp16``):
# the GEMMs at the BF16 rate (the same Tensor Core peak; ``kernels.table_dtype``), its state and reduction the
# engine's
# fp4: the same GEMMs as FP8 in NVFP4 on Blackwell (the module docstring)
PRECISIONS = ("bf16", "fp8", "fp16", "fp4")
# the precisions whose linear GEMMs run quantized under a recipe (``RECIPES``): FP8 and NVFP4
QUANTIZED = ("fp8", "fp4")

# Transformer Engine's docs ("Using FP8 with Transformer Engine"): Hopper and newer
TE_DOCS = "Transformer Engine docs, 'Using FP8 with Transformer Engine' (transformer_engine/common/recipe)"
# NeMo 2's FP8 mixed precision (nemo/lightning/pytorch/plugins/mixed_precision.py, bf16_with_fp8_mixed):
# amax_history_len 1024, amax_compute_algo "max"
AMAX_HISTORY = 1024
FP32 = 4  # bytes of a scale (blockwise) or an amax history entry
NVFP4_SOURCE = ("Transformer Engine NVFP4BlockScaling (NVIDIA/TransformerEngine@d0067d0d transformer_engine/common/"
                "recipe/__init__.py): E2M1 with an E4M3 scale per 16 elements (16x16 for weights) and an FP32 scale "
                "per tensor, random Hadamard transforms on the weight gradient's inputs, stochastically rounded "
                "gradients; arXiv:2509.25149")
# The measured NVFP4 over MXFP8 GEMM fractions of peak (the module docstring): TE's B300 GEMM benchmark,
# pre-quantized, per layer MXFP8 7.161 ms, NVFP4 3.764 ms (NVIDIA/TransformerEngine@d0067d0d docs/examples/
# gemm_profiling/gemm_profiling.rst), over B300's FP4/FP8 dense peak ratio 13,125 / 4,500 TFLOP/s (HGX B300 spec,
# ``hardware.cluster.B300_HGX``)
FP4_OVER_FP8 = (7.161 / 3.764) / (13125 / 4500)


@dataclass(frozen=True, slots=True)
class Recipe:
    """One FP8 scaling recipe.

    Attributes:
        name: as Megatron-LM's ``--fp8-recipe`` names it.
        scale_bytes: bytes of scale per quantised element (FP32 per 128-element tile: 4/128; E8M0 per
            32: 1/32; per tensor: 0).
        amax_pass: an extra read of each tensor for its amax before the cast (current scaling).
        history: the amax history is rolled per tensor every micro-batch (delayed scaling).
        needs_mx: runs only on Tensor Cores with microscaling (Blackwell).
        torchao: the name torchtitan's ``[float8] recipe_name`` takes for it, or None.
        source: where it is defined.
        precision: the precision it scales (``fp8``, or ``fp4``: NVFP4).
        element_bytes: bytes of one quantised element (FP8 1, E2M1 0.5).
        saved_fraction: the bytes of the quantised copy of a GEMM input saved for the weight gradient over the
            BF16 tensor's (``SAVED_FRACTION`` for FP8; NVFP4's column-wise copy with its scales, (0.5 + 1/16) / 2).
    """

    name: str
    scale_bytes: float
    amax_pass: bool
    history: bool
    needs_mx: bool
    torchao: str | None
    source: str
    precision: str = "fp8"
    element_bytes: float = 1.0
    saved_fraction: float = 0.5


RECIPES = {r.name: r for r in (
    Recipe("delayed", 0.0, False, True, False, None, f"{TE_DOCS}: DelayedScaling"),
    Recipe("tensorwise", 0.0, True, False, False, "tensorwise", f"{TE_DOCS}: Float8CurrentScaling; torchao "
                                                                 "Float8LinearRecipeName.TENSORWISE"),
    Recipe("blockwise", FP32 / 128, False, False, False, None,
           f"{TE_DOCS}: Float8BlockScaling; DeepSeek-V3 (arXiv:2412.19437) 3.3.2; {kernels.DEEPGEMM}"),
    Recipe("mxfp8", 1 / 32, False, False, True, None, f"{TE_DOCS}: MXFP8BlockScaling (E8M0 scale per 32)"),
    Recipe("nvfp4", 1 / 16, True, False, True, None, NVFP4_SOURCE, precision="fp4", element_bytes=0.5,
           saved_fraction=(0.5 + 1 / 16) / 2),
)}
DEFAULT_RECIPE = "delayed"  # Megatron-LM's --fp8-recipe default
FP4_RECIPE = "nvfp4"  # Megatron-LM's --fp4-recipe default and its one predefined FP4 recipe

NUMERICS_NOTE = ("FP8 changes the numerics: GEMM operands are rounded to 8 bits (E4M3 forward, E5M2 "
                 "gradients under the hybrid format); check the loss curve against a BF16 run before "
                 "committing a long training run to it")
# how a note of an FP8 plan ends: what FP8 leaves in BF16, and how to keep all of it BF16
STAYS_BF16 = "attention, norms, embedding and LM head stay BF16; --precision bf16 keeps BF16"
# The model's error on FP8's speedup itself: the median |error| of its FP8-over-BF16 GEMM speedup against the
# speedups measured on one H200 at the same shapes (benchmarks/results/hopper_runs.md, FP8 table: 8 shapes, errors
# -18.0, +2.7, -3.1, +5.8, -5.7, +3.3, +72.9, -11.4%). A step FP8 buys less than this is not one the model can tell
# from its BF16 step (the two share every other cost, so their bands' overlap says nothing here).
FP8_SPEEDUP_ERROR = 0.0575


def fp8_gain(was_s: float, now_s: float) -> str:
    """How an FP8 plan's note states its gain over the same layouts in BF16: ``1.32x``, or, inside the model's error
    of FP8's speedup (``FP8_SPEEDUP_ERROR``), that gain said to be a tie."""
    ratio = was_s / now_s
    if ratio < 1 + FP8_SPEEDUP_ERROR:
        return (f"{ratio:.2f}x, inside the model's error of FP8's speedup ({100 * FP8_SPEEDUP_ERROR:.0f}%, "
                "measured on H200): a tie with BF16")
    return f"{ratio:.2f}x"
NUMERICS_NOTE_FP4 = ("NVFP4 changes the numerics more than FP8: GEMM operands are rounded to 4 bits (E2M1, a scale "
                     "per 16 elements), gradients stochastically; NVIDIA's NVFP4 pre-training keeps some last layers "
                     "in BF16 (Megatron-LM --first-last-layers-bf16; --first-last-layers-bf16 N,M here): check the "
                     "loss curve against a BF16 or FP8 run before committing a long training run to it")
FP8_RECIPES = tuple(name for name, r in RECIPES.items() if r.precision == "fp8")


def has_fp8(device) -> bool:
    """Whether ``device`` has FP8 Tensor Cores (its preset lists an ``fp8`` peak)."""
    return "fp8" in device.peak_flops


def has_mx(device) -> bool:
    """Whether ``device`` has microscaling Tensor Cores (MXFP8, NVFP4): it lists an ``fp4`` peak, which came
    with the same (Blackwell) generation."""
    return "fp4" in device.peak_flops


# the cluster presets whose device has FP4 Tensor Cores (Blackwell)
FP4_PRESETS = tuple(name for name, (device, _) in PRESETS.items() if has_mx(device))


def default_recipe(device, framework: str = "megatron") -> str:
    """The recipe a run on ``device`` takes when none is named: MXFP8 on Blackwell (the recipe
    Megatron-Bridge's Blackwell performance configs run); elsewhere Megatron-LM's default (delayed)
    under Transformer Engine, and tensorwise (torchao's dynamic scaling, torchtitan's float8
    converter) under the engines on PyTorch's own kernels."""
    if has_mx(device):
        return "mxfp8"
    return "tensorwise" if engine_named(framework).pytorch_kernels else DEFAULT_RECIPE


def named_recipe(recipe: str | None, device, framework: str = "megatron", precision: str = "fp8") -> str:
    """The recipe a run names, or where it names none (None) the default: under FP8 the device's and the
    engine's (``default_recipe``), under FP4 NVFP4 (``FP4_RECIPE``)."""
    if recipe is not None:
        return recipe
    return FP4_RECIPE if precision == "fp4" else default_recipe(device, framework)


def numerics_note(recipe: str) -> str:
    """The numerics note of a plan whose GEMMs run under ``recipe``."""
    return NUMERICS_NOTE_FP4 if RECIPES[recipe].precision == "fp4" else NUMERICS_NOTE


def gemm_refusal(op, sizes) -> str | None:
    """Why ``op``'s local GEMM (``gemm_shape``) cannot run in FP8, or None: Transformer Engine's
    ``assert_dim_for_fp8_exec`` (and ``torch._scaled_mm``) take rows in multiples of 8 and widths in
    multiples of 16."""
    m, n, k = gemm_shape(op, sizes)
    if "e" in op.in_dims[0] and "e" in op.in_dims[1]:
        m = 8  # grouped GEMMs pad each expert's tokens (Megatron's --moe-router-padding-for-fp8)
    if m % 8 or n % 16 or k % 16:
        return f"{op.name}'s GEMM {m:g} x {n:g} x {k:g} is not a multiple of 8 x 16 x 16"
    return None


def shape_refusal(model, tp: int, cp: int, tokens: int) -> str | None:
    """Why Transformer Engine would refuse the FP8 GEMMs of ``model`` at tp, cp with ``tokens``
    tokens per micro-batch (micro batch x seq), or None: ``assert_dim_for_fp8_exec``, "FP8 execution
    requires 2D input matrices with height divisible by 8 and width divisible by 16"."""
    if (tokens // cp) % 8:
        return f"FP8 GEMMs need the tokens per micro-batch and rank ({tokens // cp}) divisible by 8"
    for what, width in (("hidden size", model.hidden), ("MLP width per tp rank", model.ffn // tp),
                        ("attention width per tp rank", model.heads * model.head_dim // tp)):
        if width % 16:
            return f"FP8 GEMMs need the {what} ({width}) divisible by 16"
    return None


def refusal(precision: str, recipe: str | None, device, framework: str | None = None) -> str | None:
    """Why ``precision`` with ``recipe`` does not run on ``device`` under ``framework`` (one line with the fix), or
    None (``device``, ``framework``: None where not known yet)."""
    if precision not in PRECISIONS:
        return f"precision {precision!r}; use one of {', '.join(PRECISIONS)}"
    if precision == "fp4":
        return fp4_refusal(recipe, device, framework)
    if precision != "fp8":
        return None if recipe is None else f"an FP8 recipe ({recipe}) needs --precision fp8"
    if recipe is not None and recipe not in FP8_RECIPES:
        if recipe in RECIPES:
            return (f"the {recipe} recipe scales FP4 GEMMs; use --precision fp4, or an FP8 recipe "
                    f"({', '.join(FP8_RECIPES)})")
        return f"FP8 recipe {recipe!r}; use one of {', '.join(FP8_RECIPES)}"
    if device is None:
        return None
    if not has_fp8(device):
        return (f"{device.name} has no FP8 Tensor Cores (its peaks: {', '.join(sorted(device.peak_flops))}); "
                "use --precision bf16")
    if recipe is not None and RECIPES[recipe].needs_mx and not has_mx(device):
        return f"the {recipe} recipe needs Blackwell's microscaling Tensor Cores, which {device.name} lacks; use " \
               "--fp8-recipe delayed, tensorwise or blockwise"
    return None


def fp4_refusal(recipe: str | None, device, framework: str | None = None) -> str | None:
    """Why NVFP4 does not run with ``recipe`` on ``device`` under ``framework`` (the engine's ``fp4`` refusal,
    ``cost.engine.Engine.refuses``), or None."""
    if recipe is not None and recipe != FP4_RECIPE:
        return (f"--precision fp4 runs Transformer Engine's nvfp4 recipe (Megatron-LM's --fp4-recipe), not the FP8 "
                f"recipe {recipe!r}; leave --fp8-recipe out or give nvfp4")
    eng = ENGINES.get(ALIASES.get(framework, framework)) if framework is not None else None
    why = engine_refusal(eng, fp4=True) if eng is not None else None
    if why is not None:
        return why
    if device is not None and not has_mx(device):
        other = "fp8" if has_fp8(device) else "bf16"
        return (f"NVFP4 needs Blackwell's FP4 Tensor Cores (presets {', '.join(FP4_PRESETS)}), which {device.name} "
                f"lacks; use --precision {other}")
    return None


def fp8_gemm(op) -> bool:
    """Whether ``op`` runs in FP8 under an FP8 recipe: a linear layer that is not the LM head (its
    output has the vocabulary) nor the MoE router (experts in its output, not in its input)."""
    if op.kind != "linear":
        return False
    out, x = op.out_dims[0], op.in_dims[0]
    return "v" not in out and not ("e" in out and "e" not in x)


def _product(dims, sizes) -> float:
    n = 1.0
    for d in dims:
        n *= sizes[d]
    return n


def gemm_shape(op, sizes) -> tuple[float, float, float]:
    """(M, N, K) of a linear op at local ``sizes``: M the input's own dims (tokens), K the dims it
    shares with the weight (reduced), N the weight's own dims; the expert dim of a grouped GEMM is in
    neither (M is then the tokens per expert)."""
    return kernels.gemm_dims(op, sizes)[:3]


def _tables(device) -> tuple:
    """The kernel tables whose FP8/BF16 ratio ``device`` takes: its own when it has an FP8 GEMM table,
    else H100's (the one measured FP8 table, DeepGEMM: a stated transfer of the ratio, not of rates)."""
    try:
        dev = kernels.device_kernels(device)
    except PlanError:
        dev = None
    if dev is not None and "fp8" in dev.gemm and "fp8" in dev.grouped:
        return dev, 1.0
    src = kernels.H100
    # the same ideal time on H100 as on this device: its shapes scaled by the ratio of BF16 peaks
    return src, src.peak_tflops["bf16"] * 1e12 / device.flops("bf16")


def fp4_factor(device) -> float:
    """How much faster an FP4 GEMM runs than the same GEMM in FP8 on ``device``: its FP4/FP8 peak ratio times
    the measured ratio of the NVFP4 and MXFP8 kernels' fractions of their peaks (``FP4_OVER_FP8``)."""
    return device.flops("fp4") / device.flops("fp8") * FP4_OVER_FP8


def gemm_speedup(op, sizes, device, recipe: Recipe | None = None) -> float:
    """How much faster ``op``'s GEMMs run in FP8 than in BF16 on ``device`` at local ``sizes``: the FP8
    over the BF16 peak times the FP8 over the BF16 fraction of ``cost.kernels`` at the GEMM's shape
    (grouped expert GEMMs: their tokens-per-expert curves). Floored at 1: below the BF16 table's
    smallest measured GEMM its fraction is a clamp, not a measurement. Under an FP4 ``recipe`` that times
    ``fp4_factor``."""
    if recipe is not None and recipe.precision == "fp4":
        return gemm_speedup(op, sizes, device) * fp4_factor(device)
    dev, scale = _tables(device)
    m, n, k = gemm_shape(op, sizes)
    if "e" in op.in_dims[0] and "e" in op.in_dims[1]:
        tokens = m * scale
        ratio = (kernels.grouped_gemm_efficiency(dev, tokens, "fp8")
                 / kernels.grouped_gemm_efficiency(dev, tokens, "bf16"))
    else:
        m = max(m * scale, 1.0)
        ratio = kernels.gemm_efficiency(dev, m, n, k, "fp8") / kernels.gemm_efficiency(dev, m, n, k, "bf16")
    return max(1.0, device.flops("fp8") / device.flops("bf16") * ratio)


def floor_speedup(op, sizes, device, recipe: Recipe | None = None) -> float:
    """An upper bound of ``gemm_speedup`` over every piece of ``op`` (``sizes``: the whole op), for
    ``opcost.op_floor``: a piece's FP8 fraction is at most the whole GEMM's (the tables' envelopes do
    not fall with FLOPs) and its BF16 fraction at least the table's smallest (under an FP4 ``recipe``
    times ``fp4_factor``, a constant)."""
    if recipe is not None and recipe.precision == "fp4":
        return floor_speedup(op, sizes, device) * fp4_factor(device)
    dev, scale = _tables(device)
    m, n, k = gemm_shape(op, sizes)
    if "e" in op.in_dims[0] and "e" in op.in_dims[1]:
        fp8 = kernels.grouped_gemm_efficiency(dev, m * scale, "fp8")
        curve, bf16_scale = dev.grouped["bf16"]
        least = min(curve.ys) * bf16_scale
    else:
        fp8 = kernels.gemm_efficiency(dev, max(m * scale, 1.0), n, k, "fp8")
        least = min(kernels.gemm_envelope(dev, "bf16")[1])
    return max(1.0, device.flops("fp8") / device.flops("bf16") * fp8 / least)


def cast_bytes(op, sizes, recipe: Recipe, weights_per_microbatch: bool) -> tuple[float, float]:
    """Bytes the FP8 (or FP4) casts of ``op`` move per micro-batch, forward and backward (see the module
    docstring): the activation input forward and the output gradient backward, each read in BF16 and
    written as two quantised copies with their scales (plus an amax read under current scaling and NVFP4,
    and the amax history rolled under delayed scaling); the weight forward when ``weights_per_microbatch``."""
    per = 2.0 + 2.0 * (recipe.element_bytes + recipe.scale_bytes) + (2.0 if recipe.amax_pass else 0.0)
    x = _product(op.in_dims[0], sizes)
    y = _product(op.out_dims[0], sizes)
    fwd, bwd = per * x, per * y
    if weights_per_microbatch:
        fwd += per * _product(op.in_dims[1], sizes)
    if recipe.history:  # read and write the history of the input (forward) and the gradient (backward)
        fwd += 2 * AMAX_HISTORY * FP32 * (2 if weights_per_microbatch else 1)
        bwd += 2 * AMAX_HISTORY * FP32
    return fwd, bwd


# The FP8 copy of a GEMM input saved for the weight gradient, over the BF16 tensor's bytes (``Recipe.saved_fraction``)
SAVED_FRACTION = 0.5
assert all(r.saved_fraction == SAVED_FRACTION for r in RECIPES.values() if r.precision == "fp8")


def weight_copy_bytes(recipe: Recipe, caches_weights: bool) -> float:
    """Bytes per weight element an engine keeps besides its weights under ``recipe``: the FP8 weight
    and its transpose (2 B, with the recipe's scales; NVFP4's two E2M1 copies 2 x (0.5 + 1/16) B) where it
    caches them (Transformer Engine), 0 where it casts per forward (torchao)."""
    return 2.0 * (recipe.element_bytes + recipe.scale_bytes) if caches_weights else 0.0


def is_mxfp8(recipe: Recipe) -> bool:
    """Whether ``recipe`` is MXFP8 (an FP8 recipe that needs microscaling Tensor Cores), whose quantized weights
    Megatron gathers in BF16 (``param_gather_bytes``, ``param_cast_bytes``, ``export.megatron.lowp_args``)."""
    return recipe.needs_mx and recipe.precision == "fp8"


def param_gather_bytes(recipe: Recipe) -> float:
    """Bytes per weight element the data-parallel parameter gather moves when the weights are held quantized
    (``fp8_param_gather``, the module docstring): the row-wise quantized data (FP8 1 B, NVFP4 0.5 B); MXFP8 2 B
    (in BF16 through the gradient buffer under the distributed optimizer; row-wise and column-wise buffers under
    Megatron-FSDP, ``fsdp``)."""
    return 2.0 if is_mxfp8(recipe) else recipe.element_bytes


def param_cast_bytes(recipe: Recipe, fsdp: bool) -> float:
    """Bytes per owned weight element the optimizer step moves beyond the BF16 write of the default step to cast
    its shard into quantized weights (``fp8_param_gather``, the module docstring): the BF16 copy read back (2 B),
    its amax read (2 B, not under delayed scaling, whose cast takes the amax) and the quantized write (the gathered
    bytes with the recipe's scales); 0 for MXFP8 under the distributed optimizer (not ``fsdp``), which writes the
    BF16 copy and quantizes after the gather."""
    if is_mxfp8(recipe) and not fsdp:
        return 0.0
    return 2.0 + (0.0 if recipe.history else 2.0) + param_gather_bytes(recipe) + recipe.scale_bytes


def lowp_weight_bytes(recipe: Recipe, fsdp_sharded: bool) -> float:
    """Bytes per element a weight held quantized (``fp8_param_gather``) keeps as the parameter itself, besides the
    quantized copies of the ``fp8_weights`` term: none where the weights are replicated (the quantized copies are
    the weights: ZeRO 1, 2), the gathered bytes of the shard where Megatron-FSDP shards them (ZeRO 3, per shard
    element: ``fsdp_sharded``)."""
    return param_gather_bytes(recipe) if fsdp_sharded else 0.0


def quantized_params(precision: str, zero: int) -> bool:
    """Whether weights stated quantized (``fp8_param_gather``) are held so at ``precision`` and ZeRO ``zero``: FP8
    or FP4 GEMMs with Megatron's distributed optimizer or Megatron-FSDP (ZeRO >= 1), NVFP4's at ZeRO 1 only
    (``lowp_refusal`` refuses the rest of a stated configuration)."""
    return precision in QUANTIZED and zero >= 1 and not (precision == "fp4" and zero >= 2)


def lowp_refusal(precision: str, recipe: str | None, zero: int, fp8_param_gather: bool,
                 bf16_layers: tuple[int, int], layers: int | None = None, pp: int = 1) -> str | None:
    """Why a configuration in ``precision`` under ``recipe`` at ZeRO ``zero`` cannot hold the stated low-precision
    facts (the module docstring: Megatron-LM's refusals), in one line with the fix, or None. ``layers`` and ``pp``
    (when given) bound the BF16 layer counts."""
    low = precision in QUANTIZED
    flag = "--fp4-param-gather" if precision == "fp4" else "--fp8-param-gather"
    if fp8_param_gather and not low:
        return (f"{flag} keeps the layers' weights in FP8 or FP4, but precision is {precision} (Megatron: "
                "'fp8_param must be used together with fp8 mode'); use --precision fp8 or fp4, or leave it out")
    if fp8_param_gather and zero == 0:
        return (f"{flag} needs Megatron's distributed optimizer or Megatron-FSDP ('only supported with distributed "
                "optimizer ... megatron fsdp'); use --zero 1, 2 or 3, or leave it out")
    if fp8_param_gather and precision == "fp4" and zero >= 2:
        return ("--fp4-param-gather under Megatron-FSDP (ZeRO 2, 3) is not modelled: its parameter buffers have no "
                "NVFP4 path; use --zero 1, or leave it out")
    if tuple(bf16_layers) == (0, 0):
        return None
    if not low:
        return (f"--first-last-layers-bf16 keeps layers in BF16 out of FP8 or FP4, but precision is {precision}: "
                "nothing to keep; use --precision fp8 or fp4, or leave it out")
    if precision == "fp8" and recipe == "delayed":
        return ("--first-last-layers-bf16 with delayed scaling: Megatron refuses it ('Delayed scaling does not "
                "support first / last layer in BF16'); use --fp8-recipe tensorwise, blockwise or mxfp8")
    if layers is None:
        return None
    first, last = bf16_layers
    if first + last > layers:
        return (f"--first-last-layers-bf16 {first},{last} keeps {first + last} layers of the model's {layers} in "
                f"BF16; keep at most {layers}")
    if precision == "fp8" and max(first, last) > layers // pp:
        return (f"--first-last-layers-bf16 {first},{last}: Megatron keeps at most layers // pp = {layers // pp} "
                f"layers at each end in BF16 (TransformerConfig); use counts <= {layers // pp} or a smaller pp")
    return None


def lowp_fact_refusal(fp8_param_gather, bf16_layers) -> str | None:
    """A malformed low-precision fact (``fp8_param_gather`` a bool, ``bf16_layers`` two layer counts >= 0), in
    one line with the fix, or None."""
    if not isinstance(fp8_param_gather, bool):
        return f"fp8_param_gather={fp8_param_gather!r}; use True or False"
    counts = tuple(bf16_layers) if isinstance(bf16_layers, (tuple, list)) else ()
    if len(counts) != 2 or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
        return (f"bf16_layers={bf16_layers!r}; give two layer counts >= 0, the first and last layers kept in BF16 "
                "(--first-last-layers-bf16 N,M)")
    return None
