"""Frozen test round 5: the two scaling tables Megatron-LM's README published (in none of the project's files).

    python benchmarks/megatron_readme_runs.py --parse   # (once) writes the frozen test file megatron_readme_runs.csv
    python benchmarks/megatron_readme_runs.py --check   # each row described and evaluated, measured columns unread
    python benchmarks/megatron_readme_runs.py           # the comparison, read once -> benchmarks/results/
    python benchmarks/megatron_readme_runs.py --stated  # post-hoc: with the loss kernel Megatron-LM ran

Sources (images in NVIDIA/Megatron-LM, transcribed by hand into ``SC21`` and ``MCORE``):
  - SC21 PTD-P (Narayanan et al. 2021, the paper's Table 1): ``images/cases_april2021.png`` at 937571cfd4^ (deleted
    there, 2024-07-15), with the README text beside it: "All models use a vocabulary size of 51,200 and a sequence
    length of 2048 ... Selene ... Each cluster node has 8 NVIDIA 80GB A100 GPUs ... the FLOPs are measured for
    end-to-end training". Columns: model size, hidden, layers, parameters, model-parallel size (tp x pp), GPUs,
    batch, achieved teraFLOP/s per GPU, % of peak. The achieved FLOP/s count the paper's
    96 B s l h^2 (1 + s / 6h + V / 16 l h) per step (SC21 eq. 3: the forward, backward and recomputed forward,
    attention in full), so the measured step is that count / (FLOP/s x GPUs). Attention heads are not in the
    image: the paper's Table 1 (24, 32, 32, 48, 64, 80, 96, 128, 128, 160; head dimension 96 for the two smallest,
    128 up to 310B, 160 above).
  - Megatron-Core r0.8.0 on H100 (weak scaling): ``images/model_table.png`` at f2e5db402c (2024-07-15), with the
    README: "Vocabulary size: 131,072 tokens; Sequence length: 4,096 tokens; ... Fine-grained overlapping with DP
    (--overlap-grad-reduce, --overlap-param-gather), TP (--tp-comm-overlap), and PP". Columns: model size, heads,
    hidden, layers, TP, PP, DP, GPUs, batch, per-GPU teraFLOP/s, MFU. The FLOP count is Megatron's
    ``num_floating_point_operations`` at that commit (megatron/training/training.py: 12 B s L h^2 (1 + g/a + s/h
    + ffn/h + V / 2 L h), attention in full, no recomputation counted), so the measured step is that / (FLOP/s x
    GPUs). The sizes add up only as GPT blocks (ffn 4h) with an untied output layer (1.7B: 12 L h^2 + 2 V h).

How each row is described (chosen before any comparison; what the sources leave open is chosen as stated here):
  - SC21: Megatron-LM as the A100 calibration rows describe it (``calibration._Cache.report``: GPT blocks with
    biases, dropout, learned positions, tied embeddings, unfused attention, fp16, fp32 gradients all-reduced after
    backward, no communication overlap), full recomputation, no sequence parallelism (2022), the plain 1F1B
    schedule (no interleaving stated), tp = min(model-parallel size, 8) and pp = the rest; the micro-batch is not
    stated: the fastest fitting of 1, 2, 4, 8 (the runs were tuned benchmarks).
  - Megatron-Core r0.8.0: Megatron-core as the H100 calibration rows describe it (``modern``: ZeRO 1 distributed
    optimizer, overlapped gradient reduce and parameter gather, TP communication overlap), BF16, Transformer
    Engine's fused attention, sequence parallelism where tp > 1, Megatron's argument defaults where the README is
    silent (dropout 0.1, learned absolute positions, biases); the plain 1F1B schedule; micro-batch and
    recomputation not stated: the fastest fitting of micro-batch 1, 2, 4 with no recomputation, else selective,
    else full.
"""

from __future__ import annotations

import sys
from pathlib import Path

from symtensor.calibration import _Cache
from symtensor.errors import PlanError
from symtensor.hardware import GIB, load_cluster
from symtensor.models import ModelConfig
from symtensor.plan.document import config_band
from symtensor.plan.parallelism import Parallelism
from symtensor.plan.stack import Stack

from frozen_runs import check_rows, compared, read_rows, row_table, sha256, step_report, write_parsed as frozen_write
from results_files import write_results

RUNS = Path(__file__).parent / "megatron_readme_runs.csv"
MEASURED = ("tflops_per_gpu", "pct_of_peak", "step_time_s")
SC21_SOURCE = "NVIDIA/Megatron-LM@937571cfd4^ images/cases_april2021.png (SC21 PTD-P, Table 1)"
MCORE_SOURCE = "NVIDIA/Megatron-LM@f2e5db402c images/model_table.png (Megatron-Core r0.8.0, weak scaling)"
TABLES = {"SC21": "SC21 PTD-P, A100", "MCORE": "Megatron-Core r0.8.0, H100"}
# (size, hidden, layers, heads, model-parallel size, GPUs, batch, teraFLOP/s per GPU, % of peak)
SC21 = (("1.7B", 2304, 24, 24, 1, 32, 512, 137, 44), ("3.6B", 3072, 30, 32, 2, 64, 512, 138, 44),
        ("7.5B", 4096, 36, 32, 4, 128, 512, 142, 46), ("18B", 6144, 40, 48, 8, 256, 1024, 135, 43),
        ("39B", 8192, 48, 64, 16, 512, 1536, 138, 44), ("76B", 10240, 60, 80, 32, 1024, 1792, 140, 45),
        ("145B", 12288, 80, 96, 64, 1536, 2304, 148, 47), ("310B", 16384, 96, 128, 128, 1920, 2160, 155, 50),
        ("530B", 20480, 105, 128, 280, 2520, 2520, 163, 52), ("1T", 25600, 128, 160, 512, 3072, 3072, 163, 52))
# (size, heads, hidden, layers, TP, PP, DP, GPUs, batch, teraFLOP/s per GPU, MFU %)
MCORE = (("1.7B", 16, 2048, 24, 1, 1, 48, 48, 192, 408.8, 41), ("7.1B", 32, 4096, 30, 2, 1, 48, 96, 192, 465.9, 47),
         ("16B", 48, 6144, 32, 4, 1, 48, 192, 192, 489.1, 49), ("32B", 56, 7168, 48, 8, 1, 48, 384, 192, 459.6, 46),
         ("70B", 64, 8192, 84, 8, 2, 48, 768, 384, 419.7, 42), ("119B", 80, 10240, 92, 8, 4, 48, 1536, 768, 420.5, 43),
         ("177B", 96, 12288, 96, 8, 6, 48, 2304, 1152, 432.8, 44),
         ("314B", 128, 16384, 96, 8, 8, 48, 3072, 1536, 474.4, 48),
         ("462B", 144, 18432, 112, 8, 16, 48, 6144, 3072, 459.9, 47))


def _row(table: str, size: str, dims: tuple, degrees: tuple, batch: int, tflops: float, peak: float,
         flops: float) -> dict:
    """One run: ``dims`` (layers, hidden, heads, vocab, seq), ``degrees`` (tp, pp, dp), the measured FLOP/s per GPU
    and share of peak, and the step those FLOP/s imply for the step's ``flops`` (the source's own count)."""
    (layers, h, heads, v, s), (tp, pp, dp) = dims, degrees
    return {"table": table, "source": SC21_SOURCE if table == "SC21" else MCORE_SOURCE, "size": size,
            "system": "dgx-a100-80g" if table == "SC21" else "dgx-h100", "layers": layers, "hidden": h,
            "heads": heads, "ffn": 4 * h, "vocab": v, "seq": s, "tp": tp, "pp": pp, "dp": dp, "gpus": tp * pp * dp,
            "global_batch": batch, "tflops_per_gpu": tflops, "pct_of_peak": peak,
            "step_time_s": f"{flops / (tflops * 1e12 * tp * pp * dp):.4f}"}


def parse() -> list[dict]:
    """Both tables as rows: the run, its configuration, then the measured columns (``MEASURED``)."""
    rows = []
    for size, h, layers, heads, mp, gpus, batch, tflops, peak in SC21:
        s, v = 2048, 51200
        flops = 96 * batch * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
        rows.append(_row("SC21", size, (layers, h, heads, v, s), (min(mp, 8), mp // min(mp, 8), gpus // mp), batch,
                         tflops, peak, flops))
        assert rows[-1]["gpus"] == gpus, f"{size}: tp x pp x dp is not the table's {gpus} GPUs"
    for size, heads, h, layers, tp, pp, dp, gpus, batch, tflops, mfu in MCORE:
        s, v = 4096, 131072
        flops = 12 * batch * s * layers * h * h * (2 + s / h + 4 + v / (2 * layers * h))
        rows.append(_row("MCORE", size, (layers, h, heads, v, s), (tp, pp, dp), batch, tflops, mfu, flops))
        assert rows[-1]["gpus"] == gpus, f"{size}: tp x pp x dp is not the table's {gpus} GPUs"
    return rows


def model(r: dict) -> ModelConfig:
    sc21 = r["table"] == "SC21"
    return ModelConfig(name=f"{r['table']} {r['size']}", family="gpt", layers=int(r["layers"]),
                       hidden=int(r["hidden"]), heads=int(r["heads"]), ffn=int(r["ffn"]), vocab=int(r["vocab"]),
                       max_context=int(r["seq"]), mlp="gelu", norm="layernorm", tied=sc21, learned_pos=True,
                       bias=True, attention="unfused" if sc21 else "flash", dropout=True)


STATED = ("post-hoc (``--stated``), after this round was read: the Megatron-Core rows with Megatron-LM's own loss "
          "kernel, the vocab-parallel cross-entropy it runs without --cross-entropy-loss-fusion (``Stack.loss``, "
          "``cost.stack_kernels``), a flag the README's list of what the runs enabled does not name and Megatron-LM "
          "leaves off (megatron/training/arguments.py at f2e5db402c); nothing else changed")


def evaluate(r: dict, cache: _Cache | None = None, stated: bool = False) -> dict:
    """The row described as the module docstring says: its fastest fitting choice of what the source leaves open;
    ``stated``: as ``STATED`` says."""
    cache = cache or _Cache()
    cfg, sc21 = model(r), r["table"] == "SC21"
    tp, pp, dp, batch = int(r["tp"]), int(r["pp"]), int(r["dp"]), int(r["global_batch"])
    gpu, dtype = ("dgx-a100-80g", "fp16") if sc21 else ("dgx-h100", "bf16")
    best, tried = None, []
    for rec in ("full",) if sc21 else ("none", "selective", "full"):
        for mb in (1, 2, 4, 8) if sc21 else (1, 2, 4):
            if batch % (dp * mb):
                continue
            p = Parallelism(tp=tp, pp=pp, dp=dp, sp=tp > 1 and not sc21, zero=0 if sc21 else 1, recompute=rec,
                            micro_batch=mb, global_batch=batch, seq=int(r["seq"]),
                            stack=Stack(loss="vocab-parallel" if stated and not sc21 else None))
            try:
                rep = cache.report(cfg, p, gpu=gpu, dtype=dtype, modern=not sc21)
            except PlanError as e:
                tried.append(f"mb {mb} {rec}: {e}")
                continue
            if rep.fits and (best is None or rep.step_time_s < best[0].step_time_s):
                best = (rep, p)
        if best is not None:
            break
    said = "SC21: 2021 Megatron-LM, fp16, full recompute" if sc21 else "Megatron-Core r0.8.0, BF16, ZeRO 1, overlaps" \
        + (", vocab-parallel loss" if stated else "")
    if best is None:
        return {"status": "does not fit", "why": "; ".join(tried) or "no micro-batch of 1-8 fits", "described_as": said}
    rep, p = best
    cluster = load_cluster(gpu, devices=int(r["gpus"]))
    band = config_band(cfg, cluster, rep.step_time_s, zero=p.zero, seq=p.seq, framework="megatron",
                       precision="bf16", tp=tp)
    return {"status": "fits", "why": "", "described_as": f"{said}; micro-batch {p.micro_batch}, recompute "
            f"{p.recompute}", "step_s": rep.step_time_s, "reserved_gib": rep.memory_reserved / GIB, "band": band}


def write_parsed(rows: list[dict]) -> None:
    frozen_write(RUNS, rows)


def compare(stated: bool = False) -> int:
    out, done, cache = [], [], _Cache()
    for r in read_rows(RUNS, MEASURED, with_measured=True):
        e = evaluate(r, cache, stated)
        res = {"table": r["table"], "size": r["size"], "system": r["system"], "gpus": r["gpus"],
               "degrees": f"tp{r['tp']} pp{r['pp']} dp{r['dp']}", "batch": r["global_batch"],
               "measured_s": float(r["step_time_s"]), "predicted_s": e.get("step_s"), "error": None,
               "inside_band": None, "status": e["status"], "reserved_gib": e.get("reserved_gib"), "why": e["why"],
               "described_as": e["described_as"]}
        if compared(res, e, res["measured_s"]):
            done.append(res)
        out.append(res)
    lines = step_report("Held-out test round 5: the scaling tables of Megatron-LM's README", "megatron_readme_runs",
                        out, done, lambda x: (TABLES[x["table"]],))
    cols = ["table", "size", "system", "gpus", "degrees", "batch", "measured_s", "predicted_s", "error", "status",
            "reserved_gib", "inside_band", "why", "described_as"]
    lines += row_table(out, cols, {"measured_s": lambda v: f"{v:.3f}", "predicted_s": lambda v: f"{v:.3f}"})
    if stated:
        lines[0] = "# Megatron-LM's README scaling tables, described as the runs ran (post-hoc)"
        lines[1:1] = ["", f"Not a held-out score: {STATED}."]
    write_results("megatron_readme_runs_stated" if stated else "megatron_readme_runs", lines, out)
    return 0


def main(argv: list[str]) -> int:
    if "--parse" in argv:
        rows = parse()
        write_parsed(rows)
        print(f"wrote {len(rows)} rows to {RUNS} (sha256 {sha256(RUNS)})")
        return 0
    if "--check" in argv:
        cache = _Cache()
        return check_rows(read_rows(RUNS, MEASURED, with_measured=False), lambda r: evaluate(r, cache),
                          lambda r: f"{r['table']} {r['size']} on {r['gpus']} {r['system']}:")
    return compare("--stated" in argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
