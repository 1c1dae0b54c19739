"""Plans, baselines, evaluations, exports and run specs of reference scenarios as one JSON file, for
byte-identity checks across refactors (a refactor must leave it unchanged, or explain each difference):

    python benchmarks/reference_outputs.py before.json --fuzz 40    # on the old commit
    python benchmarks/reference_outputs.py after.json --fuzz 40     # on the new one; then cmp the two

``--fuzz N``: also the plans of the first N seeded fuzz cases (seed 2) on at most 2,048 devices.
Times (``search_time_s``, the search's phases) are left out: they differ from run to run.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from symtensor import api
from symtensor.errors import PlanError
from symtensor.export import FORMATS, export
from symtensor.plan.document import evaluation_json, plan_json

ROOT = Path(__file__).resolve().parents[1]
PLANS = [("llama2-7b", "dgx-a100-80g", 64, "megatron"), ("llama2-7b", "dgx-a100-80g", 8, "fsdp2"),
         ("llama3-8b", "dgx-h100", 64, "deepspeed"), ("mixtral-8x7b", "dgx-h100", 64, "megatron"),
         ("llama2-70b", "dgx-h100", 64, "megatron"), ("gpt3-1.3b", "dgx-a100-80g", 128, "fsdp2"),
         ("qwen3-30b-a3b", "dgx-h100", 64, "megatron"), ("tiny-llama", "dgx-h100", 8, "fsdp2")]
EVALS = [dict(model="llama2-7b", cluster="dgx-a100-80g", devices=64, tp=2, pp=2, zero=1),
         dict(model="llama2-7b", cluster="dgx-a100-80g", devices=64, tp=1, zero=3, framework="fsdp2"),
         dict(model="llama2-7b", cluster="dgx-a100-80g", devices=64, tp=1, zero=2, framework="fsdp2"),
         dict(model="llama2-7b", cluster="dgx-a100-80g", devices=64, tp=1, zero=1, framework="deepspeed"),
         dict(model="llama3-8b", cluster="dgx-h100", devices=64, tp=2, cp=2, zero=1, framework="fsdp2"),
         dict(model="mixtral-8x7b", cluster="dgx-h100", devices=64, tp=2, ep=8, zero=1),
         dict(model="mixtral-8x7b", cluster="dgx-h100", devices=64, tp=1, ep=8, zero=3, framework="fsdp2"),
         dict(model="llama2-70b", cluster="dgx-h100", devices=64, tp=4, pp=4, vpp=2, recompute="selective", zero=1)]
# (model, processes, options of the runtime's choose_plan): the run specs `symtensor run` would launch
RUNS = [("tiny-llama", 4, dict(tp=1)), ("tiny-llama", 2, dict(zero=3)), ("tiny-llama", 2, dict(tp=1, zero=2)),
        ("tiny-llama", 4, dict(tp=2)), ("tiny-llama", 4, dict(tp=2, zero=3)),
        ("tiny-mixtral", 4, dict(tp=1, ep=4)), ("tiny-qwen3-moe", 2, dict(tp=2, ep=2)),
        ("tiny-llama", 4, dict(pp=2)), ("tiny-mixtral", 4, dict(tp=1))]


def without_times(out: dict) -> dict:
    out.pop("search_time_s", None)
    out.pop("search_phases_s", None)
    return out


def exports(plan) -> dict:
    out = {}
    for f in FORMATS:
        try:
            out[f] = export(plan, f)
        except PlanError as exc:
            out[f] = f"REFUSED: {exc}"
    return out


def run_specs() -> dict:
    from symtensor.models import load_model_config
    from symtensor.runtime.verify import choose_plan, plan_to_spec, predicted_bytes

    out = {}
    for model, nproc, kw in RUNS:
        key = f"{model}/{nproc}/{kw}"
        try:
            plan = choose_plan(load_model_config(model), nproc, 8, 16, **kw)
            out[key] = {"spec": plan_to_spec(plan).to_dict(), "bytes": predicted_bytes(plan)}
        except PlanError as exc:
            out[key] = f"REFUSED: {exc}"
    return out


def fuzz_plans(n: int) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from fixtures.fuzzing import seeded_case

    out = {}
    for i in range(n):
        case = seeded_case(2, i)
        if case.devices > 2048:
            continue
        try:
            plan = case.plan()
            out[f"fuzz {i} {case.command()}"] = {"json": without_times(plan_json(plan)), "exports": exports(plan)}
        except PlanError as exc:
            out[f"fuzz {i} {case.command()}"] = f"REFUSED: {exc}"
    return out


def main(argv) -> int:
    from symtensor import calibration

    t0 = time.time()
    res = {}
    for model, cluster, devices, framework in PLANS:
        plan, base = api.plan_with_baselines(model, cluster, devices, framework=framework)
        res[f"plan {model} {cluster} {devices} {framework}"] = {
            "json": without_times(plan_json(plan, base)), "exports": exports(plan),
            "baseline_exports": {k: exports(v) for k, v in base.items() if v is not None}}
    for e in EVALS:
        e = dict(e)
        plan = api.evaluate(e.pop("model"), e.pop("cluster"), e.pop("devices"), **e)
        res[f"eval {e}"] = {"json": evaluation_json(plan), "exports": exports(plan)}
    res["runspecs"] = run_specs()
    if "--fuzz" in argv:
        res.update(fuzz_plans(int(argv[argv.index("--fuzz") + 1])))
    res["calibration"] = [str(r) for r in calibration.predict()]
    with open(argv[0], "w") as f:
        json.dump(res, f, indent=1, sort_keys=True, default=str)
    print(f"wrote {argv[0]} ({len(res)} entries, {time.time() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
