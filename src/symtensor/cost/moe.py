"""Mixture-of-experts as it is trained today: the token dispatcher, routing imbalance, capacity and
token dropping, shared experts overlapped with the dispatch. The graph (``models.builder``) holds
the MoE layer at the mean load (capacity ``c`` = top_k x tokens / experts per sequence, Megatron's
alltoall dispatcher: the permuted buffer carries top_k copies of each token); this module turns
what the engine does with it into seconds and bytes. ``cost.segment`` reads it for the edges into
and out of the experts (``ep_comm``) and for the expert ops; ``TrainConfig`` carries the choices.

Dispatchers (``TrainConfig.stack.moe_dispatcher``):
    alltoall  Megatron's MoEAlltoAllTokenDispatcher (and torchtitan's all-to-all): the permuted
              buffer, top_k copies per token, through one NCCL all-to-all (``cost.collectives``).
    deepep    DeepEP's normal kernels (Megatron ``--moe-token-dispatcher-type flex
              --moe-flex-dispatcher-backend deepep``): a token goes once to each node that holds one of its experts
              (RDMA) and from there once to each rank of that node that does (NVLink forwarding),
              so the bytes are the token times the expected number of distinct nodes / ranks its
              top_k experts fall on (``distinct``), not top_k. Measured bottleneck bandwidths
              (deepseek-ai/DeepEP docs/legacy.md @ 0297fc8, "Normal kernels with NVLink and RDMA
              forwarding", H800 with ~160 GB/s NVLink and a CX7 400 Gb/s NIC, ~50 GB/s): intranode
              EP 8 dispatch 153 GB/s, combine 158 GB/s; internode EP 16 43 GB/s, EP 32 58 GB/s,
              EP 64 51 GB/s (the internode figures are "logical" and include the local-rank share).
              Taken as fractions of the link: NVLink 153/160, RDMA 43/50 (the lowest measured row:
              this module counts only the bytes that leave the node). On Blackwell's NVLink 5 (the devices
              with an FP4 peak, ``precision.has_mx``: HGX B200/B300 and the GB200/GB300 NVL72 domains) DeepEP
              moves far less than its Hopper fraction of the link: the measured "Torch API" algorithm
              bandwidths of DeepEP's normal kernels on GB200 (deepseek-ai/DeepEP@94a9f8f6b146c07d97ec58f67cd6d303
              296d6098, branch hybrid-ep, docs/README_Hybrid-EP.md, "DeepEP Performance Results", BF16 dispatch and
              combine at 8, 16 and 24 ranks, 4,096 tokens of hidden 7,168, top-8) are taken by the HybridEP
              rule below (``DEEPEP_NVL5_ROWS``: the row of the fewest measured ranks >= the group's ranks in
              the domain, 24's beyond, its harmonic mean times (n - 1)/n over the 900 GB/s NVLink 5), at
              DeepEP's default 20 SMs (deep_ep/buffer.py ``Buffer.num_sms = 20``, which Megatron keeps when
              --moe-flex-dispatcher-num-sms is unset): the mean of the measured 16- and 24-SM rows. The
              24-rank combine (145 GB/s) is measured as such (DeepEP's normal kernels forward over at most 8
              NVLink peers; Megatron-LM@d98e8a64dd transformer_config.py: "Currently only 'hybridep' backend
              supports the MNNVL case"). B200's own 8-rank DeepEP row (the same file: 421 / 361 GB/s at 20
              SMs) is within 4% of GB200's (437 / 368).
    hybridep  NVIDIA's HybridEP (Megatron ``--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend
              hybridep``, what its Blackwell recipes run; torchtitan's ``comm_backend="hybridep"``): the same
              two-level route as DeepEP, deduplicated the same way ("Similar to DeepEP, Hybrid-EP first
              performs IB communication between peer GPUs, then each rank distributes the received inter-node
              data locally"; its buffers hold a rank's tokens once per remote NVLink domain and once per
              destination rank, and the combine pre-reduces inside a domain before it sends: deepseek-ai/DeepEP
              @94a9f8f6b146c07d97ec58f67cd6d303296d6098, branch hybrid-ep, docs/Hybrid-EP_Implementation.md
              sections 4.2 and 8), so its bytes are ``distinct``'s as DeepEP's; a "node" is an NVLink domain
              (``num_of_nodes``: "Number of NVLink domains"), the innermost level of the cluster. Megatron runs
              it in BF16 (fused_a2a.py ``init_hybrid_ep_buffer`` asserts fp8_dispatch off) and, dropless,
              synchronises with the host once per dispatch for the permuted token count (token_dispatcher.py
              ``_HybridEPManager.dispatch``, NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553), which
              the "Torch API" measurements below include ("misc = device_sync, update_flag", tests/
              test_hybrid_ep.py). Rates: the README's measured "Torch API" algorithm bandwidths (docs/
              README_Hybrid-EP.md at the same commit; 4,096 tokens per rank, hidden 7,168, top-8, uniform
              random router, 8 local experts per rank), BF16 dispatch and combine. "Algorithm bandwidth"
              counts, per rank, the tokens it receives including its own (``nvl_recv_bytes``) and, across
              domains, its tokens times the domains they go to including its own (``rdma_send_bytes``,
              tests/utils.py ``count_rdma_send_from_routing_map``: "we do not set the local node map to
              zeros"); this module counts the bytes that cross a level, (n - 1)/n of those in expectation over
              n ranks (domains), so a row's fraction of the link is its bandwidth x (n - 1)/n / the link
              (``hybridep_fraction``), which reproduces the measured time at the measured point. A dispatch
              edge's gradient runs the combine kernel and a combine edge's the dispatch kernel, so each level
              takes the harmonic mean of the two rates (a layer's step moves the same bytes through each
              twice). Which row (``HYBRIDEP_NVL_ROWS``, ``HYBRIDEP_IB_ROWS``): inside an NVLink domain the
              GB200 MNNVL rows at 16 SMs (torchtitan's default, HYBRIDEP_NUM_SMS_DISPATCH 16: pytorch/
              torchtitan@b5bcd76c66d0acb1a08b176d9639425bc55e0b2a torchtitan/models/common/config_utils.py; below
              HybridEP's own default of 24 inside one domain, csrc/hybrid_ep/config.cuh ``Configurer`` L366,
              which Megatron keeps when --moe-flex-dispatcher-num-sms is unset; the 32-SM rows run up to 15%
              faster, at 24 ranks) for the
              fewest measured ranks >= the group's ranks in the domain, 36's beyond 36 (unmeasured: larger
              domains borrow it); across domains the H100 InfiniBand rows at 8 SMs (HybridEP's default across
              domains, the same line) for the fewest measured domains >= the group's (2, 4, 8 domains of 8:
              ranks 16, 32, 64), 8's beyond. Borrowed rows: an 8-GPU NVSwitch node (Hopper, Ampere, B200, B300)
              takes the GB200 8-rank row as a fraction of its own NVLink (no intranode HybridEP row on Hopper
              is published; B200's 8-rank row, 535.94 / 530.86 GB/s at 16 SMs, is within 3% of GB200's);
              Blackwell's scale-out (B200, B300, GB200 and GB300 racks over InfiniBand or Ethernet) takes the
              H100 InfiniBand rows as a fraction of its own NIC (no other is published). Megatron's rules on
              the flex dispatcher (transformer_config.py ``__post_init__`` L1743-1762, L1868-1882: not beside
              --moe-enable-deepep, "Only one backend"; --moe-pad-expert-input-to-capacity refused with deepep
              only; --moe-expert-rank-capacity-factor for hybridep or ncclep) concern no option the planner
              states or exports, so ``refusal`` adds none; DeepSpeed's engines have neither kernel
              (``engine_refusal``, ``Engine.moe_dispatchers``).

Routing imbalance (``TrainConfig.stack.moe_routing``): ``balanced`` (Megatron's
``--moe-router-force-load-balancing``, every rank the mean) or ``aux_loss`` (a router trained with
the load-balancing auxiliary loss, dropless): the step waits for the most-loaded rank of the EP
group, so the expert GEMMs, their saved buffers and the all-to-all that feeds them scale by the
expected maximum over the ``n`` ranks of the group of the rank loads (``load_factor``):

    E[max] / mean = 1 + z(n) * sqrt(1 / mu + cv^2 / e_local)

with mu the token copies a rank receives (multinomial sampling noise, which shrinks with tokens per
rank), cv the spread of expert popularity under the auxiliary loss (the rank sums e_local experts),
and z(n) the expected maximum of n standard normals (Blom's approximation). cv from the published
global imbalance of an auxiliary-loss-balanced router: MaxVio_global = max load / mean load - 1 =
0.52 for the 3B model of Wang et al. 2024 ("Auxiliary-Loss-Free Load Balancing Strategy for
Mixture-of-Experts", arXiv 2408.15664, Table 2, the auxiliary-loss-controlled rows: 1B 0.72, 3B 0.52;
Loss-Free 0.04 at both), so cv = 0.52 / z(64). Checked against two transcriptions of that table in
public repositories (the paper's own page is not in the stored corpora): the value holds, the table is
Table 2 (an earlier note said Table 1). The 64 experts per layer are not confirmed by what was found.

Capacity (``TrainConfig.stack.moe_capacity_factor``, Megatron ``--moe-expert-capacity-factor`` with
``--moe-token-drop-policy probs``): an expert keeps at most F x its mean tokens and drops the rest,
so the rank's load is at most F x the mean: min(load_factor, F). None: dropless.

Shared experts (``TrainConfig.stack.moe_shared_overlap``, Megatron ``--moe-shared-expert-overlap``): the
shared expert's GEMMs run on their own stream while the dispatch and combine all-to-alls are in
flight, so the ``ep_comm`` of a layer hides behind them (``engine.hidden``); otherwise both are
serial.

Expert-parallel overlap across micro-batches (``TrainConfig.stack.moe_ep_overlap``, Megatron
``--overlap-moe-expert-parallel-comm --delay-wgrad-compute``, the MoE model zoo's A2A_OVERLAP=1, "+1f1b
overlap"): in the 1F1B steady state Megatron runs one micro-batch's forward and another's backward as one
combined step, layer by layer, with the communication on its own stream, so the forward's dispatch and
combine hide behind the backward's compute and the other way round (megatron/core/pipeline_parallel/
combined_1f1b.py, ``forward_backward_step``/``schedule_chunk_1f1b``, recipe ``ep_a2a``). A layer's
``ep_comm`` then hides behind the layer's compute (``engine.hidden``) in the share of micro-batches that
run paired (``ep_overlap_share``): all but the first forward and the last backward without a pipeline
(``combined_1f1b_schedule_for_no_pipelining``), all but the interleaved schedule's warm-up and cool-down
with one (``engine.pipeline_window``). Megatron's TransformerConfig refuses it without expert parallelism,
with full recomputation, beside --moe-shared-expert-overlap, and with pp > 1 but no virtual pipeline
(``overlap_refusal``).

What the combine keeps for backward (``saved_scale``, ``Engine.moe_combine_keeps``): the graph's ``moe_combine``
weights the experts' output by the router probabilities and keeps both for their gradients (GShard's combine, the
engines' default). Megatron-core applies the probabilities inside the experts' activation instead and unpermutes
without them (NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553: moe/token_dispatcher.py
``MoEAlltoAllTokenDispatcher.combine_postprocess`` L876-908 and ``_DeepepManager.get_restored_hidden_states_by_experts``
L1459-1468 call ``unpermute`` without ``probs``; moe/moe_utils.py ``unpermute`` L497-625 then scatter-adds, keeping only
the indices, and TE's fused ``_moe_unpermute_mask_map`` saves only its ``row_id_map`` without ``merging_probs``;
moe/experts.py ``TEGroupedMLP.forward`` ``bias_act_func`` L943-1016 multiplies by ``permuted_probs`` in the fused
``weighted_bias_swiglu_impl``, whose WeightedSwiGLUFunction (fusions/fused_bias_swiglu.py L266-270) keeps the fc1 output
it keeps anyway and the [tokens, 1] fp32 probabilities), since Megatron-LM 2659630721 (2025-04-09, "Memory efficient
token permutation"): its combine keeps nothing of the hidden width (0). torchtitan weights on the token side after the
combine all-to-all, on an fp32 copy (pytorch/torchtitan@b5bcd76c66d0acb1a08b176d9639425bc55e0b2a
torchtitan/models/common/token_dispatcher.py ``AllToAllTokenDispatcher.combine`` L562-630 and
``LocalTokenDispatcher.combine`` L141-170: ``routed_output_RD.to(torch.float32) * scores``), whose multiply keeps the
fp32 operand: twice the bf16 expert output (2).
"""

from __future__ import annotations

import math
from statistics import NormalDist

from symtensor.cost.collectives import collective_time, level_counts
from symtensor.cost.engine import ALIASES, ENGINES, pipeline_window
from symtensor.cost.precision import has_mx
from symtensor.errors import PlanError

DISPATCHERS = ("alltoall", "deepep", "hybridep")
ROUTINGS = ("balanced", "aux_loss")

# deepseek-ai/DeepEP docs/legacy.md @ 0297fc8 (normal kernels, H800): bottleneck bandwidth over the link's
DEEPEP_NVLINK_FRACTION = 153 / 160  # intranode EP 8 dispatch 153 GB/s of ~160 GB/s NVLink
DEEPEP_RDMA_FRACTION = 43 / 50  # internode EP 16 dispatch 43 GB/s of ~50 GB/s CX7 (the lowest row)
# deepseek-ai/DeepEP@94a9f8f6b146c07d97ec58f67cd6d303296d6098 docs/README_Hybrid-EP.md, DeepEP's GB200 "Torch API"
# rows (ranks, BF16 dispatch GB/s, combine GB/s) at DeepEP's default 20 SMs: the mean of the 16- and 24-SM rows
# (8: 362.01/310.21 and 512.72/425.95; 16: 328.80/278.34 and 442.47/378.32; 24: 324.64/126.53 and 450.22/163.62)
DEEPEP_NVL5_ROWS = ((8, (362.01 + 512.72) / 2, (310.21 + 425.95) / 2),
                    (16, (328.80 + 442.47) / 2, (278.34 + 378.32) / 2),
                    (24, (324.64 + 450.22) / 2, (126.53 + 163.62) / 2))

# deepseek-ai/DeepEP@94a9f8f6b146c07d97ec58f67cd6d303296d6098 (branch hybrid-ep) docs/README_Hybrid-EP.md, HybridEP's
# "Torch API" algorithm bandwidths in GB/s (BF16 dispatch, combine) by the group's ranks in one NVLink domain: the
# GB200 table's 16-SM rows (ranks 8, 16, 24, 32, 36), of GB200's 900 GB/s NVLink 5 per GPU each way (the preset)
HYBRIDEP_NVL_ROWS = ((8, 550.10, 538.44), (16, 472.84, 474.48), (24, 441.89, 444.40), (32, 485.50, 423.19),
                     (36, 469.96, 418.27))
HYBRIDEP_NVL_LINK_GBPS = 900
# the same file, the H100 table ("IB Bandwidth"), 8-SM rows, by NVLink domains (nodes of 8: ranks 16, 32, 64), of
# the H100's one ConnectX-7 400 Gb/s NIC per GPU, 50 GB/s each way (the dgx-h100 preset)
HYBRIDEP_IB_ROWS = ((2, 57.74, 56.96), (4, 46.54, 50.68), (8, 41.46, 47.68))
HYBRIDEP_IB_LINK_GBPS = 50

# Wang et al. 2024 (arXiv 2408.15664) Table 2: MaxVio_global of the auxiliary-loss-controlled 3B model (the
# 1B model's is 0.72); its expert count (64) unconfirmed (module docstring)
AUX_LOSS_MAXVIO = 0.52
AUX_LOSS_EXPERTS = 64


def expected_max_normal(n: int) -> float:
    """E[max of n iid standard normals], Blom's approximation Phi^-1((n - 0.375) / (n + 0.25));
    0 for n = 1."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


AUX_LOSS_CV = AUX_LOSS_MAXVIO / expected_max_normal(AUX_LOSS_EXPERTS)  # spread of expert popularity


def refusal(dispatcher: str, capacity_factor, routing: str, shared_overlap, ep_overlap=False) -> str | None:
    """One line naming the bad MoE option and the fix, or None."""
    if dispatcher not in DISPATCHERS:
        return f"moe_dispatcher={dispatcher!r}; use one of {', '.join(DISPATCHERS)}"
    if routing not in ROUTINGS:
        return f"moe_routing={routing!r}; use one of {', '.join(ROUTINGS)}"
    number = isinstance(capacity_factor, (int, float)) and not isinstance(capacity_factor, bool)
    if capacity_factor is not None and not (number and 1.0 <= capacity_factor < math.inf):
        return (f"moe_capacity_factor={capacity_factor!r} must be a number >= 1 (an expert keeps that many times its "
                "mean tokens); leave it out for dropless training")
    if not isinstance(shared_overlap, bool):
        return f"moe_shared_overlap must be true or false, got {shared_overlap!r}"
    if not isinstance(ep_overlap, bool):
        return f"moe_ep_overlap must be true or false, got {ep_overlap!r}"
    return None


def engine_refusal(dispatcher: str, framework: str) -> str | None:
    """Why ``framework``'s engine does not run the token dispatcher ``dispatcher`` (``Engine.moe_dispatchers``: DeepEP
    and HybridEP are Megatron-core's flex dispatcher and torchtitan's comm backends, not DeepSpeed's), or None."""
    eng = ENGINES.get(ALIASES.get(framework, framework))
    if eng is None or dispatcher in eng.moe_dispatchers:
        return None  # (TrainConfig names an unknown engine)
    return (f"moe_dispatcher={dispatcher!r}: framework {framework} dispatches with {', '.join(eng.moe_dispatchers)} "
            "only; use --moe-dispatcher alltoall, or --framework megatron or fsdp2")


def overlap_refusal(p) -> str | None:
    """Megatron's TransformerConfig rules for --overlap-moe-expert-parallel-comm on configuration ``p``
    (``plan.Parallelism``), one line each, or None (the module docstring)."""
    if not p.stack.moe_ep_overlap:
        return None
    if p.framework != "megatron":
        return f"moe_ep_overlap is Megatron's --overlap-moe-expert-parallel-comm; framework {p.framework} has none"
    if p.ep <= 1:
        return "moe_ep_overlap overlaps the expert all-to-alls: it needs ep > 1"
    if p.recompute == "full":
        return "moe_ep_overlap does not run with full recomputation (Megatron refuses it); use --recompute selective"
    if p.stack.moe_shared_overlap:
        return "moe_ep_overlap and moe_shared_overlap exclude each other (Megatron refuses both); keep one"
    if p.pp > 1 and p.vpp <= 1:
        return "moe_ep_overlap with pp > 1 needs the interleaved schedule (Megatron refuses it without); give --vpp"
    return None


def ep_overlap_runs(train) -> bool:
    """Whether Megatron runs the combined 1F1B schedule for ``train`` (``overlap_refusal``'s rules that a
    training configuration can check; a search holding ``moe_ep_overlap`` drops it where they fail)."""
    return train.framework == "megatron" and train.recompute != "full" and (train.pp == 1 or train.vpp > 1)


def ep_overlap_share(train) -> float:
    """The share of a stage's micro-batches whose forward and backward run paired under
    ``moe_ep_overlap`` (the module docstring): 1 - (its pipeline warm-up in micro-batches) / micro-batches."""
    return max(0.0, 1.0 - pipeline_window(train) / train.micro_steps)


def active(train) -> bool:
    """Whether ``train`` asks for anything beyond today's costing (alltoall, balanced, dropless,
    serial shared experts): the hooks leave every other step untouched, byte for byte."""
    s = train.stack
    return (s.moe_dispatcher != "alltoall" or s.moe_routing != "balanced"
            or s.moe_capacity_factor is not None or s.moe_shared_overlap or s.moe_ep_overlap)


def load_factor(train, experts_local: float, copies_local: float, n_ranks: int) -> float:
    """Max over the EP group of the rank loads over their mean (the module docstring):
    ``experts_local`` experts per rank, ``copies_local`` token copies a rank receives at the mean
    per micro-batch, ``n_ranks`` ranks holding distinct experts. 1 with balanced routing or one rank;
    capped at the capacity factor when tokens are dropped."""
    if train.stack.moe_routing == "balanced" or n_ranks <= 1 or copies_local <= 0:
        f = 1.0
    else:
        f = 1.0 + expected_max_normal(n_ranks) * math.sqrt(1.0 / copies_local + AUX_LOSS_CV ** 2 / experts_local)
    cap = train.stack.moe_capacity_factor
    return f if cap is None else min(f, cap)


def expert_op(op) -> bool:
    """Ops whose work is the routed tokens: the grouped expert GEMMs and their activation (an output
    with expert slots ``c``; the dispatch that fills them is the edge's, the router's ``[b, s, e]``
    scores have none)."""
    return op.kind != "moe_dispatch" and any("c" in dims for dims in op.out_dims)


def op_load_factor(train, op, sizes: dict, experts: int) -> float:
    """``load_factor`` of an expert op whose local sizes are ``sizes`` (e experts, b x c slots each)
    in a model of ``experts`` routed experts."""
    e = sizes.get("e", 1.0)
    copies = e * sizes.get("b", 1.0) * sizes.get("c", 1.0)
    return load_factor(train, e, copies, max(1, round(experts / e)))


def saved_scale(op, io: str, idx: int, engine) -> float:
    """How many times its bytes ``engine`` keeps of the tensor in slot ``io``/``idx`` that ``op`` saves for backward
    (``kinds.op_saves``): ``Engine.moe_combine_keeps`` for the combine's expert output (the module docstring), 1 for
    every other saved tensor."""
    return engine.moe_combine_keeps if op.kind == "moe_combine" and io == "in" and idx == 0 else 1.0


def distinct(experts: int, top_k: int, groups: int) -> float:
    """Expected number of the ``groups`` equal blocks of experts that a token's ``top_k`` experts
    (uniform, without replacement) fall in: groups x (1 - C(E - E/g, k) / C(E, k))."""
    if groups <= 1:
        return 1.0
    per = experts // groups
    miss = math.comb(experts - per, top_k) / math.comb(experts, top_k) if experts - per >= top_k else 0.0
    return groups * (1.0 - miss)


def deepep_time(nbytes: float, counts, levels, experts: int, top_k: int, device) -> float:
    """Seconds of one DeepEP normal dispatch (or combine) whose alltoall buffer would be ``nbytes``
    per device (top_k copies of each token) over a group with ``counts`` members per level
    (innermost, the NVLink domain, first): RDMA carries each token once per remote node holding one
    of its experts, NVLink once per other rank of a node that does; both run at once, the slower
    bounds it; one latency per level, as the kernel launches once. On ``device``'s NVLink: H800's
    measured fraction, or on Blackwell GB200's measured rows (the module docstring)."""
    nvl = hybridep_fraction(DEEPEP_NVL5_ROWS, counts[0], HYBRIDEP_NVL_LINK_GBPS) if has_mx(device) \
        else DEEPEP_NVLINK_FRACTION
    return two_level_time(nbytes, counts, levels, experts, top_k, nvl, DEEPEP_RDMA_FRACTION)


def hybridep_fraction(rows, n: int, link_gbps: float) -> float:
    """The fraction of a link that HybridEP's bytes crossing it get over ``n`` ranks (NVLink) or domains
    (InfiniBand) (the module docstring): the row of ``rows`` (n, dispatch GB/s, combine GB/s) for the
    fewest measured >= n, else the largest; the harmonic mean of its two algorithm bandwidths times the
    share (n' - 1)/n' of its bytes that crossed, over ``link_gbps``.

    >>> round(hybridep_fraction(HYBRIDEP_IB_ROWS, 3, HYBRIDEP_IB_LINK_GBPS), 4)  # the 4-domain row
    0.7278
    """
    m, dispatch, combine = next((r for r in rows if r[0] >= n), rows[-1])
    return 2.0 / (1.0 / dispatch + 1.0 / combine) * (m - 1) / m / link_gbps


def hybridep_time(nbytes: float, counts, levels, experts: int, top_k: int, device=None) -> float:
    """Seconds of one HybridEP dispatch (or combine) whose alltoall buffer would be ``nbytes`` per device,
    as ``deepep_time`` routes it, at HybridEP's measured fractions of the NVLink domain (the group's
    ranks in it, ``counts[0]``) and of the scale-out NIC (the domains it spans) (the module docstring)."""
    outer = 1
    for c in counts[1:]:
        outer *= c
    nvl = hybridep_fraction(HYBRIDEP_NVL_ROWS, counts[0], HYBRIDEP_NVL_LINK_GBPS)
    rdma = hybridep_fraction(HYBRIDEP_IB_ROWS, outer, HYBRIDEP_IB_LINK_GBPS)
    return two_level_time(nbytes, counts, levels, experts, top_k, nvl, rdma)


def two_level_time(nbytes: float, counts, levels, experts: int, top_k: int, nvl_fraction: float,
                   rdma_fraction: float) -> float:
    """Seconds of a deduplicating two-level dispatch (DeepEP's, HybridEP's) whose alltoall buffer would be
    ``nbytes`` per device (top_k copies of each token) over a group with ``counts`` members per level
    (innermost, the NVLink domain, first), its bytes crossing the NVLink domain at ``nvl_fraction`` of the
    innermost level's bandwidth and the scale-out at ``rdma_fraction`` of the slowest outer level's."""
    token = nbytes / top_k  # one copy of the rank's tokens
    inner = counts[0]
    outer = 1
    for c in counts[1:]:
        outer *= c
    group = inner * outer
    ranks = distinct(experts, top_k, group)
    nvl = token * ranks * (inner - 1) / inner if inner > 1 else 0.0
    t = nvl / (levels[0].bandwidth * nvl_fraction) if nvl else 0.0
    latency = levels[0].latency if inner > 1 else 0.0
    if outer > 1:
        nodes = distinct(experts, top_k, outer)
        rdma = token * nodes * (outer - 1) / outer
        bw = min(lv.bandwidth for lv, c in zip(levels[1:], counts[1:]) if c > 1)
        t = max(t, rdma / (bw * rdma_fraction))
        latency += sum(lv.latency for lv, c in zip(levels[1:], counts[1:]) if c > 1)
    return latency + t


_TWO_LEVEL = {"deepep": deepep_time, "hybridep": hybridep_time}  # the dispatchers that deduplicate (their time)


def edge_seconds(seconds: float, colls, ev, train, load: float) -> float:
    """The seconds of a dispatch or combine edge (the collectives ``colls`` the graph's
    redistribution charges ``seconds`` for) under ``train``'s dispatcher, times the ``load`` factor
    of the most-loaded rank (its all-to-all receives that many times the mean)."""
    if train.stack.moe_dispatcher == "alltoall" and load == 1.0:
        return seconds
    cfg = ev.graph.meta["config"]
    total = 0.0
    for c in colls:
        counts = level_counts(c.axes, ev.mesh, len(ev.levels))
        if c.kind == "all_to_all" and train.stack.moe_dispatcher in _TWO_LEVEL:
            t = _TWO_LEVEL[train.stack.moe_dispatcher](c.nbytes, counts, ev.levels, cfg.experts, cfg.top_k,
                                                 ev.cluster.device)
        else:
            t = collective_time(c.kind, c.nbytes, counts, ev.levels, ev.eff.link_for(c.kind))
        total += t * (load if c.kind == "all_to_all" else 1.0)
    return total


def check(train) -> None:
    """Raise the one-line PlanError of ``refusal`` for ``train``'s MoE options."""
    s = train.stack
    why = refusal(s.moe_dispatcher, s.moe_capacity_factor, s.moe_routing, s.moe_shared_overlap,
                  s.moe_ep_overlap) or engine_refusal(s.moe_dispatcher, train.framework)
    if why is not None:
        raise PlanError(why)
