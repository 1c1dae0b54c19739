"""Plans you can trust (issue 14), on random cases: random dense and MoE models, 1 to 20,000
devices on nodes of 4, 8 and 16, random sequences, batches and engines (``fixtures.fuzzing``, the
one definition of the cases and properties, which ``benchmarks/fuzz_plans.py`` runs at length).

Every case is checked for every property: no crash, a valid plan or a one-line PlanError, ``fits``
as memory and capacity say, no worse than the Megatron grid best, monotone under doubling the
devices, a plan file that reloads and explains, exports that launch or are refused. The cases are
fixed (derandomized hypothesis); all of them run and the failure lists every violation with the
``symtensor plan`` line that reproduces it, rather than stopping and shrinking at the first.

The cases are checked in ``SHARDS`` tests that pytest-xdist runs side by side (issue 24: one test
of 40 cases was the last to finish ``make test`` on 2 cores): each draws the same cases and checks
every ``SHARDS``-th one. The drawing function's source is unchanged, since derandomized hypothesis
seeds itself from it: any change would draw other cases.
"""

from __future__ import annotations

import json
import shlex
import time

import pytest
from hypothesis import HealthCheck, given, settings

from symtensor.cli import main

from fixtures import fuzzing
from fixtures.fuzzing import PROPERTIES, ROOT, cases, seeded_case

CASES = 40  # about 80 s on a 2-core machine at bb38bfa (each case: two plans with their grids, a grid, file, exports)
SHARDS = 4


@pytest.mark.parametrize("shard", range(SHARDS), ids=[f"shard{i}of{SHARDS}" for i in range(SHARDS)])
def test_random_plans_keep_every_property(shard):
    results, seen, drawn = [], set(), []

    def check_case(case):  # (the name ``check`` calls) this shard's cases only: every SHARDS-th distinct one
        drawn.append(case)
        return fuzzing.check_case(case) if (len(drawn) - 1) % SHARDS == shard else None

    @settings(derandomize=True, deadline=None, max_examples=CASES, database=None,
              suppress_health_check=list(HealthCheck))
    @given(cases())
    def check(case):
        if case not in seen:  # hypothesis mutates its examples: some repeat exactly
            seen.add(case)
            results.append(check_case(case))

    t0 = time.perf_counter()
    check()
    seconds = time.perf_counter() - t0
    results = [r for r in results if r is not None]
    assert len(drawn) >= CASES // 2, f"hypothesis ran only {len(drawn)} cases"
    checked = {p: sum(p in r.checked for r in results) for p in PROPERTIES}
    assert checked["valid"] and checked["grid"] and checked["monotone"], f"properties never checked: {checked}"
    failed = [r for r in results if r.violations]
    summary = (f"{len(failed)} of {len(results)} cases of shard {shard} ({len(drawn)} in all; {seconds:.0f} s) "
               f"violate a property; cases checked per property {checked}")
    assert not failed, summary + "\n" + "\n".join(r.report() for r in failed)


def test_reproduction_line_is_the_case(capsys, monkeypatch):
    """The ``symtensor plan`` line a violation prints (from the repository root) plans the case
    the harness planned: here one on a cluster file of 4 devices a node."""
    monkeypatch.chdir(ROOT)
    case = seeded_case(0, 4)
    assert case.cluster.endswith("h100-node4.json")
    plan = case.plan()
    words = shlex.split(case.command("--json", "--no-baselines"))
    assert main(words[1:]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step_time_s"] == plan.report.step_time_s and out["config"] == json.loads(json.dumps(plan.config))
