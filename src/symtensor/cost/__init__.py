"""The symbolic cost model: compute, hierarchical communication, redistribution, memory."""

from symtensor.cost.efficiency import CALIBRATED, Efficiency, efficiency_for
from symtensor.cost.model import GIB, CostReport, Evaluator, split_mesh
from symtensor.cost.train import RECOMPUTE, TrainConfig

__all__ = ["CALIBRATED", "GIB", "RECOMPUTE", "CostReport", "Efficiency", "Evaluator", "TrainConfig",
           "efficiency_for", "split_mesh"]
