"""Capture speed: Hugging Face LlamaForCausalLM with the LLaMA-2-7B config, on fake tensors.

    python benchmarks/capture_speed.py     # writes benchmarks/results/capture_speed.md

Wall seconds of ``capture_hf`` (torch.export + lowering to the IR), median of 3, and of planning
the captured model on 64 H100 (``symtensor plan --capture``), against the built-in graph.
"""

from __future__ import annotations

import statistics
import sys
import time

from results_files import write_results


def main() -> int:
    from symtensor import api
    from symtensor.frontends import capture_hf

    times = []
    for _ in range(3):
        t = time.perf_counter()
        g = capture_hf("llama2-7b", micro_batch=1, seq=4096)
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    captured = api.plan("llama2-7b", "dgx-h100", devices=64, global_batch=1024, seq=4096, capture=True)
    plan_s = time.perf_counter() - t
    zoo = api.plan("llama2-7b", "dgx-h100", devices=64, global_batch=1024, seq=4096)
    lines = ["# Capture speed (this 2-core machine, wall seconds)", "",
             f"- capture_hf LLaMA-2-7B (fake tensors, seq 4096): median {statistics.median(times):.1f} s "
             f"(runs: {', '.join(f'{x:.1f}' for x in times)}); {g.params_total() / 1e9:.3f}B parameters, "
             f"{len(g.ops)} operators; goal 30 s",
             f"- plan --capture on 64 H100 (capture + search): {plan_s:.1f} s; "
             f"step {captured.report.step_time_s:.3f} s "
             f"vs {zoo.report.step_time_s:.3f} s for the built-in graph "
             f"({100 * (captured.report.step_time_s / zoo.report.step_time_s - 1):+.2f}%)",
             f"- configurations: captured {captured.config}, built-in {zoo.config}"]
    write_results("capture_speed", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
