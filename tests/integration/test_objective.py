"""The search optimises exactly what evaluate prints: the chosen plan's objective (its step time
in the search) equals the step time of the same plan re-evaluated from its file by a fresh
evaluator, for every zoo model at three scales."""

import pytest

from symtensor import api
from symtensor.models.config import PRESETS
from symtensor.plan import load_plan, save_plan

MODELS = sorted(name for name in PRESETS if not name.startswith("tiny"))
SCALES = (8, 64, 512)


@pytest.mark.parametrize("devices", SCALES)
@pytest.mark.parametrize("model", MODELS)
def test_search_objective_equals_evaluate(model, devices, tmp_path):
    path = tmp_path / "plan.json"
    plan = api.plan(model, "dgx-h100", devices=devices, global_batch=devices * 2, seq=2048)
    save_plan(plan, path)
    again = load_plan(path)
    assert again.report.step_time_s == pytest.approx(plan.report.step_time_s, rel=1e-9)
    assert again.report.memory_peak == pytest.approx(plan.report.memory_peak, rel=1e-9)
