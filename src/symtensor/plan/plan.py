"""The plan: the one value the search returns and everything after it reads.

A ``Plan`` is frozen data: the model, the cluster, the training configuration, the named stage
mesh and pipeline axes, per op the cuts of its iteration dims keyed by mesh-axis names (as
``jax.sharding.PartitionSpec`` names axes), the cost report, and what the search noted. It holds
no evaluator and no cache. ``explain``, ``compare``, ``export``, ``run`` and the plan files read it.

Inside the search a layout names an axis by its position in the stage mesh (``layout.OpLayout``:
ints hash and compare fastest); ``Plan.of`` turns positions into names once, when a plan leaves
the search, and ``Plan.op_layouts`` turns them back for the analyses that re-cost ops.

    >>> from symtensor.hardware import load_cluster
    >>> from symtensor.models import load_model_config
    >>> from symtensor.search import megatron_plan
    >>> plan = megatron_plan(load_model_config("tiny-llama"), load_cluster("dgx-h100", devices=8),
    ...                      tp=2, dp=4, sp=True, global_batch=8, seq=64)
    >>> plan.parallelism.tp, plan.parallelism.dp, plan.mesh.names
    (2, 4, ('nvlink0', 'nvlink1', 'nvlink2'))
    >>> plan.layouts["layers.0.q_proj"]
    {'b': ('nvlink0', 'nvlink1'), 'n': ('nvlink2',)}
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from symtensor.cost import CostReport, TrainConfig
from symtensor.graph import Graph
from symtensor.hardware import Cluster, Mesh
from symtensor.layout import OpLayout
from symtensor.models import ModelConfig
from symtensor.plan.parallelism import Parallelism, parallelism


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """A costed plan (see the module docstring).

    Attributes:
        model: the model configuration.
        cluster: the devices and their links.
        train: micro-batches, pipeline depth, virtual stages, recomputation, ZeRO stage, engine.
        seq: tokens per sequence.
        graph: the graph of one micro-step (skeleton: repeated layers stand for their run), the
            builders' or a captured model's own.
        mesh: the stage mesh (the pipeline axes taken out).
        pipeline: the mesh axes that hold the pipeline stages (outermost levels).
        layouts: per op of ``graph``, dim -> names of the axes of ``mesh`` that cut it (plain
            dicts, JSON as they are; treat them as read-only).
        report: what the plan costs (``cost.CostReport``).
        notes: what the search wants the user to know (idle axes, nothing fits, ...).
        search_time_s, search_phases_s, evaluations, partitions: the search's own account.
    """

    model: ModelConfig
    cluster: Cluster
    train: TrainConfig
    seq: int
    graph: Graph
    mesh: Mesh
    pipeline: Mesh
    layouts: dict[str, dict[str, tuple[str, ...]]]
    report: CostReport
    notes: tuple[str, ...] = ()
    search_time_s: float = 0.0
    search_phases_s: dict[str, float] = field(default_factory=dict)
    evaluations: int = 0
    partitions: int = 0

    @staticmethod
    def of(model: ModelConfig, cluster: Cluster, train: TrainConfig, seq: int, graph: Graph, mesh: Mesh,
           pipeline: Mesh, layouts: dict[str, OpLayout], report: CostReport, **search) -> Plan:
        """The plan of layouts by mesh position (the search's and the cost model's form) on
        ``mesh``; ``search``: notes, search_time_s, search_phases_s, evaluations, partitions."""
        named = {name: lay.named(mesh) for name, lay in layouts.items()}
        search["notes"] = tuple(search.get("notes", ()))
        return Plan(model=model, cluster=cluster, train=train, seq=seq, graph=graph, mesh=mesh, pipeline=pipeline,
                    layouts=named, report=report, **search)

    def with_account(self, of: Plan | None) -> Plan:
        """This plan with the search's account (search_time_s, search_phases_s, evaluations,
        partitions) of the plan ``of``; with none (zeros) when ``of`` is None: a plan that stands
        for another search's, or for no search."""
        if of is None:
            return replace(self, search_time_s=0.0, search_phases_s={}, evaluations=0, partitions=0)
        return replace(self, search_time_s=of.search_time_s, search_phases_s=of.search_phases_s,
                       evaluations=of.evaluations, partitions=of.partitions)

    @property
    def engine(self) -> str:
        """The engine whose semantics the costs follow (``megatron``, ``fsdp2``, ``deepspeed``)."""
        return self.train.framework

    @property
    def config(self) -> dict:
        """The Megatron-style summary (``plan.summary.config_summary``): the JSON's ``config``."""
        from symtensor.plan.summary import config_summary

        return config_summary(self)

    @property
    def parallelism(self) -> Parallelism:
        """The engine-neutral configuration every layer runs (``plan.parallelism.parallelism``):
        what the exports and the runtime lower; ``Heterogeneous`` (a PlanError) when the ops
        do not agree on one. Computed on each read: read it once."""
        return parallelism(self)

    def op_layouts(self) -> dict[str, OpLayout]:
        """The layouts by mesh position on ``mesh``, as the cost model reads them."""
        return {name: OpLayout.from_names(cuts, self.mesh) for name, cuts in self.layouts.items()}

    def evaluator(self):
        """A fresh evaluator of this plan's graph, cluster, pipeline depth and engine (for the
        analyses that re-cost ops; the plan keeps none)."""
        from symtensor.cost import Evaluator

        return Evaluator(self.graph, self.cluster, pp=self.train.pp, framework=self.engine)
