"""The symbolic cost model: compute, hierarchical communication, redistribution, memory."""

from symtensor.cost.efficiency import CALIBRATED, Efficiency, efficiency_for
from symtensor.cost.model import Evaluator
from symtensor.cost.pipeline import split_mesh
from symtensor.cost.report import CostReport
from symtensor.cost.train import RECOMPUTE, TrainConfig
from symtensor.hardware import GIB

__all__ = ["CALIBRATED", "GIB", "RECOMPUTE", "CostReport", "Efficiency", "Evaluator", "TrainConfig",
           "efficiency_for", "split_mesh"]
