"""Reports: console tables (and, later, the HTML report)."""

from symtensor.report.console import calibration, clusters, evaluation, graph, models, plan, run

__all__ = ["calibration", "clusters", "evaluation", "graph", "models", "plan", "run"]
