"""The torchrun runs, declared: each a tiny model, the plan ``symtensor run`` executes, and the
number of ranks (gloo processes on CPU). ``test_run.py`` runs each for two steps and judges it
against one process (losses and parameters) and against the bytes the cost model predicts.

A plan is the options that choose it (``symtensor run --help``); what they leave open, the runtime
fills with the runnable configuration the model predicts fastest.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Run:
    name: str
    model: str
    ranks: int
    plan: tuple[str, ...] = ()  # options of symtensor run that choose the plan


RUNS = (
    # plain data parallelism (the cost model predicts tp 2 fastest on the loopback cluster)
    Run("llama-4", "tiny-llama", 4, ("--tp", "1")),
    Run("mixtral-4", "tiny-mixtral", 4, ("--tp", "1")),
    Run("llama-fsdp-2", "tiny-llama", 2, ("--zero", "3", "--optimizer", "adamw")),
    # ZeRO-2 as FSDP2 without resharding after forward (the fsdp2 engine): one gather per step
    Run("llama-zero2-2", "tiny-llama", 2, ("--tp", "1", "--zero", "2", "--optimizer", "adamw")),
    Run("llama-tp-sp-2", "tiny-llama", 2, ("--tp", "2")),
    # data x tensor parallelism without FSDP: the vocabulary-parallel embedding's gradient is
    # synchronised as its parameter is placed (it once moved the whole table)
    Run("llama-dp-x-tp-4", "tiny-llama", 4, ("--tp", "2")),
    Run("llama-fsdp-x-tp-4", "tiny-llama", 4, ("--tp", "2", "--zero", "3")),
    # hybrid sharding (HSDP): fully_shard on a 2-D mesh, 2 replicas x 2 shards
    Run("llama-hsdp-2x2-4", "tiny-llama", 4, ("--tp", "1", "--zero", "3", "--dp-shard", "2", "--optimizer", "adamw")),
    Run("mixtral-ep-4", "tiny-mixtral", 4, ("--tp", "1", "--ep", "4")),  # (ep folds over tp x dp otherwise)
    # experts folded over the tensor-parallel axis (sequence parallel MoE layers, Q/K norms)
    Run("qwen3-moe-ep-over-tp-2", "tiny-qwen3-moe", 2, ("--tp", "2", "--ep", "2")),
    Run("llama-pp2-x-dp2-4", "tiny-llama", 4, ("--pp", "2")),
    Run("llama-pp2-2", "tiny-llama", 2, ("--pp", "2")),
    Run("llama-heterogeneous-4", "tiny-llama", 4, ("--tp", "2", "--attention-only-tp")),  # attention TP, rest DP
)
