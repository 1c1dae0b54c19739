"""Measurements on one Hopper GPU: GEMMs at small-model shapes, the clock under a sustained load, attention,
memory-bound kernels, the host time a per-expert grouped GEMM leaves exposed, FP8 GEMMs, and whole training
steps of GPT-3-shaped models (issue 22: "small-model H100 kernel efficiency"; issue 23: "a measured host time
per expert GEMM").

    python benchmarks/hopper_measure.py --out DIR            # on the GPU (about 4 minutes on an H200)
    python benchmarks/hopper_measure.py --out DIR --smoke    # tiny sizes on the CPU: checks the script runs

Writes DIR/hopper_measure.json (every point, with the device, driver, torch and CPU it ran on) and prints
progress. Nothing here imports symtensor: the file runs on a bare machine with torch. Every timing is the
median of repeated CUDA-event-timed batches after warm-up calls; FLOPs are 2 M N K per GEMM, attention FLOPs
the executed ones (a causal kernel skips the masked half) and, as ``full``, the non-causal count.

The expert host time is measured the way the cost model uses it (``EndToEnd.expert_s``: host seconds per
local expert of an MoE layer per micro-batch, forward and backward, the GPU waiting): a grouped expert MLP
(gate/up GEMM, SwiGLU, down GEMM, and the four backward GEMMs) run one GEMM per expert from the host after a
synchronisation, as Transformer Engine's GroupedLinear runs BF16 on Hopper (one cuBLAS call per expert:
``torch.split`` views, an output per GEMM), minus the same kernels replayed from a CUDA graph (no host work):
exposed host seconds, divided by the local experts. Under cuBLAS and under cuBLASLt (the path Transformer
Engine calls: descriptors and an algorithm heuristic per call), and for ``torch._grouped_mm`` (one launch per
group, torchtitan's path) as the contrast.
"""

# ruff: noqa: B023 - every closure below is timed inside the iteration that binds its tensors
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

RESULTS: dict = {}


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


class Timer:
    def __init__(self, device):
        self.device = device
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def per_call(self, fn, calls: int = 10, batches: int = 5, warm: int = 2) -> float:
        """Median over ``batches`` of (time of ``calls`` calls) / calls, seconds."""
        for _ in range(warm):
            fn()
        self.sync()
        out = []
        for _ in range(batches):
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(calls):
                    fn()
                b.record()
                b.synchronize()
                out.append(a.elapsed_time(b) / 1e3 / calls)
            else:
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                out.append((time.perf_counter() - t0) / calls)
        return statistics.median(out)

    def calls_for(self, seconds_each: float, budget: float = 0.02) -> int:
        return max(1, min(200, int(budget / max(seconds_each, 1e-7))))


def save(out_dir):
    with open(os.path.join(out_dir, "hopper_measure.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)


def environment(dev):
    env = {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine()}
    try:
        with open("/proc/cpuinfo") as f:
            env["cpu"] = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
        env["cpus"] = os.cpu_count()
    except (OSError, StopIteration):
        pass
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        env.update(gpu=p.name, sms=p.multi_processor_count, memory_gib=p.total_memory / 2**30,
                   cuda=torch.version.cuda, cublas_lt_preferred=os.environ.get("TORCH_BLAS_PREFER_CUBLASLT"))
        try:
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,power.limit,clocks.max.sm,clocks.max.mem,"
                 "pstate,temperature.gpu", "--format=csv"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError) as e:
            env["nvidia_smi"] = repr(e)
    return env


# -- GEMMs at the shapes of GPT-3-style models --------------------------------------------------------------------
MODELS = {"gpt3-350m": (24, 1024, 16, 4096), "gpt3-760m": (24, 1536, 16, 6144), "gpt3-1.3b": (24, 2048, 16, 8192),
          "gpt3-2.7b": (32, 2560, 32, 10240), "gpt3-6.7b": (32, 4096, 32, 16384)}
VOCAB = 50257


def gemm_sweep(dev, timer, dtype, smoke):
    tokens = (256,) if smoke else (4096, 16384)
    models = {"tiny": (2, 64, 4, 256)} if smoke else MODELS
    rows, seen = [], set()
    for name, (_, h, _, f) in models.items():
        linears = {"qkv": (3 * h, h), "proj": (h, h), "fc1": (f, h), "fc2": (h, f),
                   "head": (VOCAB if not smoke else 500, h)}
        for m in tokens:
            for lin, (n, k) in linears.items():
                # forward Y[m, n] = X[m, k] W[n, k]^T (TN), input gradient dX[m, k] = dY[m, n] W[n, k] (NN),
                # weight gradient dW[n, k] = dY[m, n]^T X[m, k] (NT): each timed at its own product shape
                for layout, (gm, gn, gk) in (("TN", (m, n, k)), ("NN", (m, k, n)), ("NT", (n, k, m))):
                    key = (gm, gn, gk, layout)
                    if key in seen:
                        continue
                    seen.add(key)
                    x = torch.randn(m, k, device=dev, dtype=dtype)
                    w = torch.randn(n, k, device=dev, dtype=dtype)
                    dy = torch.randn(m, n, device=dev, dtype=dtype)
                    fn = {"TN": lambda: F.linear(x, w), "NN": lambda: dy @ w, "NT": lambda: dy.t() @ x}[layout]
                    t1 = timer.per_call(fn, calls=1, batches=1, warm=1)
                    t = timer.per_call(fn, calls=timer.calls_for(t1), batches=5)
                    rows.append(dict(model=name, linear=lin, tokens=m, layout=layout, M=gm, N=gn, K=gk, s=t,
                                     tflops=2 * gm * gn * gk / t / 1e12))
        log("gemm", name, f"{rows[-1]['tflops']:.0f} TFLOP/s last")
    for n in ((64, 128) if smoke else (1024, 2048, 4096, 8192, 16384)):
        x = torch.randn(n, n, device=dev, dtype=dtype)
        t1 = timer.per_call(lambda: x @ x, calls=1, batches=1)
        t = timer.per_call(lambda: x @ x, calls=timer.calls_for(t1), batches=5)
        rows.append(dict(model="square", linear="square", tokens=n, layout="NN", M=n, N=n, K=n, s=t,
                         tflops=2 * n**3 / t / 1e12))
    return rows


def soak(dev, seconds, smoke):
    """8192^3 BF16 products back to back for ``seconds``; every ~0.5 s the achieved rate and the SM clock,
    power and temperature (NVML)."""
    n = 256 if smoke else 8192
    x = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    nvml = None
    if dev.type == "cuda":
        try:
            import pynvml
            pynvml.nvmlInit()
            nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device()))
        except Exception as e:  # noqa: BLE001 - the rate is still measured without clocks
            log("no NVML:", repr(e))
    samples, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        k = 0
        while time.perf_counter() - t0 < 0.5:
            for _ in range(20):
                torch.matmul(x, x, out=y)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            k += 20
        dt = time.perf_counter() - t0
        s = dict(t=time.perf_counter() - start, tflops=2 * n**3 * k / dt / 1e12)
        if nvml:
            p, h = nvml
            try:
                s.update(sm_mhz=p.nvmlDeviceGetClockInfo(h, p.NVML_CLOCK_SM),
                         power_w=p.nvmlDeviceGetPowerUsage(h) / 1e3,
                         temp_c=p.nvmlDeviceGetTemperature(h, p.NVML_TEMPERATURE_GPU))
            except Exception as e:  # noqa: BLE001
                s["nvml_error"] = repr(e)
        samples.append(s)
    out = {"n": n, "samples": samples}
    if nvml:
        p, h = nvml
        try:
            out["power_limit_w"] = p.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3
            out["max_sm_mhz"] = p.nvmlDeviceGetMaxClockInfo(h, p.NVML_CLOCK_SM)
        except Exception as e:  # noqa: BLE001
            out["nvml_error"] = repr(e)
    log("soak", f"first {samples[0]['tflops']:.0f} last {samples[-1]['tflops']:.0f} TFLOP/s",
        samples[-1].get("sm_mhz"))
    return out


def attention(dev, timer, smoke):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION} if dev.type == "cuda" \
        else {"math": SDPBackend.MATH}
    tokens, hidden = (512, 128) if smoke else (16384, 2048)
    for bname, backend in backends.items():
        for d in (64, 128):
            heads = hidden // d
            for s in ((128, 256) if smoke else (512, 1024, 2048, 4096, 8192)):
                b = tokens // s
                for causal in (False, True):
                    q, k, v = (torch.randn(b, heads, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
                               for _ in range(3))
                    g = torch.randn(b, heads, s, d, device=dev, dtype=torch.bfloat16)
                    try:
                        with sdpa_kernel([backend]):
                            fwd = timer.per_call(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                                 calls=5, batches=5)

                            def both():
                                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                                o.backward(g)
                            fb = timer.per_call(both, calls=3, batches=5)
                    except RuntimeError as e:
                        rows.append(dict(backend=bname, head_dim=d, seq=s, causal=causal, error=str(e)[:200]))
                        continue
                    full = 4.0 * b * heads * s * s * d  # forward, non-causal
                    exe = full * (0.5 if causal else 1.0)
                    bwd = fb - fwd
                    rows.append(dict(backend=bname, head_dim=d, seq=s, batch=b, heads=heads, causal=causal,
                                     fwd_s=fwd, bwd_s=bwd, fwd_tflops=exe / fwd / 1e12,
                                     bwd_tflops=2.5 * exe / bwd / 1e12,
                                     fwd_tflops_full=full / fwd / 1e12, bwd_tflops_full=2.5 * full / bwd / 1e12))
        log("attention", bname, rows[-1].get("fwd_tflops"), rows[-1].get("bwd_tflops"))
    return rows


def memory_bound(dev, timer, smoke):
    rows = []
    rows_n, width = (64, 256) if smoke else (32768, 4096)
    x = torch.randn(rows_n, width, device=dev, dtype=torch.bfloat16)
    y = torch.randn_like(x)
    w = torch.ones(width, device=dev, dtype=torch.bfloat16)
    b = torch.zeros(width, device=dev, dtype=torch.bfloat16)
    nbytes = x.numel() * 2
    ops = {"copy": (lambda: x.clone(), 2), "add": (lambda: x + y, 3),
           "layer_norm": (lambda: F.layer_norm(x, (width,), w, b), 2),
           "gelu_tanh": (lambda: F.gelu(x, approximate="tanh"), 2), "silu_mul": (lambda: F.silu(x) * y, 5),
           "softmax": (lambda: torch.softmax(x, -1), 2), "rms_norm": (lambda: F.rms_norm(x, (width,), w), 2)}
    for name, (fn, passes) in ops.items():
        t = timer.per_call(fn, calls=10, batches=5)
        rows.append(dict(op=name, elements=x.numel(), bytes=passes * nbytes, s=t, gbps=passes * nbytes / t / 1e9))
    log("memory", [(r["op"], round(r["gbps"])) for r in rows])
    return rows


# -- grouped expert MLP: the host time one GEMM per expert leaves exposed ---------------------------------------
def expert_mlp(dev, hidden, ffn, experts, tokens_per_expert, grouped: bool):
    """Forward and backward of a SwiGLU expert MLP over ``experts`` local experts, one GEMM per expert (as
    GroupedLinear on BF16 Hopper) or one ``torch._grouped_mm`` per GEMM group; returns a function issuing
    them all (no autograd: the GEMMs the layer runs, at their shapes)."""
    dt = torch.bfloat16
    e, t, h, f = experts, tokens_per_expert, hidden, ffn
    total = e * t
    x = torch.randn(total, h, device=dev, dtype=dt)
    w1 = torch.randn(e, 2 * f, h, device=dev, dtype=dt) / h**0.5
    w2 = torch.randn(e, h, f, device=dev, dtype=dt) / f**0.5
    splits = [t] * e
    out1 = torch.empty(total, 2 * f, device=dev, dtype=dt)
    act = torch.empty(total, f, device=dev, dtype=dt)
    out2 = torch.empty(total, h, device=dev, dtype=dt)
    g2 = torch.randn(total, h, device=dev, dtype=dt)
    dact = torch.empty(total, f, device=dev, dtype=dt)
    dout1 = torch.empty(total, 2 * f, device=dev, dtype=dt)
    dx = torch.empty(total, h, device=dev, dtype=dt)
    dw1 = torch.empty_like(w1)
    dw2 = torch.empty_like(w2)
    offs = torch.arange(t, total + 1, t, device=dev, dtype=torch.int32)

    if grouped:
        def run():
            o1 = torch._grouped_mm(x, w1.transpose(-2, -1), offs=offs)
            a = F.silu(o1[:, :f]) * o1[:, f:]
            torch._grouped_mm(a, w2.transpose(-2, -1), offs=offs)
            da = torch._grouped_mm(g2, w2, offs=offs)                   # input gradient of fc2
            torch._grouped_mm(g2.t(), a, offs=offs)                      # weight gradient of fc2
            d1 = torch.cat([da, da], 1)                                  # (the SwiGLU backward, shape only)
            torch._grouped_mm(d1, w1, offs=offs)                         # input gradient of fc1
            torch._grouped_mm(d1.t(), x, offs=offs)                      # weight gradient of fc1
        return run, e * t * (2 * h * 2 * f + 2 * f * h) * 3

    def run():
        xs = torch.split(x, splits)
        o1s = torch.split(out1, splits)
        for i in range(e):
            torch.mm(xs[i], w1[i].t(), out=o1s[i])
        torch.mul(F.silu(out1[:, :f]), out1[:, f:], out=act)
        acts, o2s = torch.split(act, splits), torch.split(out2, splits)
        for i in range(e):
            torch.mm(acts[i], w2[i].t(), out=o2s[i])
        gs, das = torch.split(g2, splits), torch.split(dact, splits)
        for i in range(e):
            torch.mm(gs[i], w2[i], out=das[i])
            torch.mm(gs[i].t(), acts[i], out=dw2[i])
        torch.cat([dact, dact], 1, out=dout1)
        d1s, dxs = torch.split(dout1, splits), torch.split(dx, splits)
        for i in range(e):
            torch.mm(d1s[i], w1[i], out=dxs[i])
            torch.mm(d1s[i].t(), xs[i], out=dw1[i])
    return run, e * t * (2 * h * 2 * f + 2 * f * h) * 3


CPP_LOOP = r"""
#include <torch/extension.h>
// The expert MLP's GEMMs, one per expert, from C++ (as Transformer Engine's grouped GEMM loops over its GEMMs in
// C++): forward gate/up and down, backward their input and weight gradients; the SwiGLU in between is one kernel
// over all experts, as in the Python loop.
void expert_loop(at::Tensor x, at::Tensor w1, at::Tensor w2, at::Tensor out1, at::Tensor act, at::Tensor out2,
                 at::Tensor g2, at::Tensor dact, at::Tensor dout1, at::Tensor dx, at::Tensor dw1, at::Tensor dw2,
                 int64_t e, int64_t t, int64_t f) {
  for (int64_t i = 0; i < e; ++i) {
    at::Tensor o = out1.narrow(0, i * t, t);
    at::mm_out(o, x.narrow(0, i * t, t), w1[i].t());
  }
  at::mul_out(act, at::silu(out1.narrow(1, 0, f)), out1.narrow(1, f, f));
  for (int64_t i = 0; i < e; ++i) {
    at::Tensor o = out2.narrow(0, i * t, t);
    at::mm_out(o, act.narrow(0, i * t, t), w2[i].t());
  }
  for (int64_t i = 0; i < e; ++i) {
    at::Tensor o = dact.narrow(0, i * t, t), gw = dw2[i];
    at::mm_out(o, g2.narrow(0, i * t, t), w2[i]);
    at::mm_out(gw, g2.narrow(0, i * t, t).t(), act.narrow(0, i * t, t));
  }
  at::cat_out(dout1, {dact, dact}, 1);
  for (int64_t i = 0; i < e; ++i) {
    at::Tensor o = dx.narrow(0, i * t, t), gw = dw1[i];
    at::mm_out(o, dout1.narrow(0, i * t, t), w1[i]);
    at::mm_out(gw, dout1.narrow(0, i * t, t).t(), x.narrow(0, i * t, t));
  }
}
"""


def expert_host_cpp(dev, smoke):
    """The per-expert loop driven from C++ (no Python per GEMM): exposed host seconds per local expert."""
    from torch.utils.cpp_extension import load_inline
    ext = load_inline("expert_loop_ext", cpp_sources=CPP_LOOP, functions=["expert_loop"], verbose=False)
    rows = []
    hidden, ffn = (128, 64) if smoke else (4096, 1536)
    dt = torch.bfloat16
    for e, t in ([(4, 64)] if smoke else [(e, t) for e in (4, 8, 16, 32) for t in (128, 512, 1024, 2048)]):
        total, h, f = e * t, hidden, ffn
        x = torch.randn(total, h, device=dev, dtype=dt)
        w1 = torch.randn(e, 2 * f, h, device=dev, dtype=dt) / h**0.5
        w2 = torch.randn(e, h, f, device=dev, dtype=dt) / f**0.5
        out1, act = torch.empty(total, 2 * f, device=dev, dtype=dt), torch.empty(total, f, device=dev, dtype=dt)
        out2, g2 = torch.empty(total, h, device=dev, dtype=dt), torch.randn(total, h, device=dev, dtype=dt)
        dact, dout1 = torch.empty(total, f, device=dev, dtype=dt), torch.empty(total, 2 * f, device=dev, dtype=dt)
        dx, dw1, dw2 = torch.empty(total, h, device=dev, dtype=dt), torch.empty_like(w1), torch.empty_like(w2)

        def run():
            ext.expert_loop(x, w1, w2, out1, act, out2, g2, dact, dout1, dx, dw1, dw2, e, t, f)
        rows.append(dict(path="per_expert_cpp", blas="cublas", experts=e, tokens=t, hidden=h, ffn=f,
                         **exposed_host(dev, run, e)))
    log("expert cpp", [(r["experts"], r["tokens"], round(1e6 * r.get("exposed_per_expert_s", 0), 1),
                        round(1e6 * r["issue_s"] / r["experts"], 1)) for r in rows])
    return rows


def exposed_host(dev, run, experts: int) -> dict:
    """``run`` (an expert MLP's GEMMs) after three warm-ups: the median of 15 eager runs from a synchronised GPU
    (wall seconds and the host's issue seconds), of 15 replays of its CUDA graph (the kernels alone), and the
    difference per local expert (the host time the GPU waits for)."""
    for _ in range(3):
        run()
    eager = []
    for _ in range(15):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        run()
        t_issue = time.perf_counter() - t0
        if dev.type == "cuda":
            torch.cuda.synchronize()
        eager.append((time.perf_counter() - t0, t_issue))
    row = dict(eager_s=statistics.median(w for w, _ in eager), issue_s=statistics.median(i for _, i in eager))
    if dev.type != "cuda":
        return row
    try:
        graph = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            run()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(graph):
            run()
        replay = []
        for _ in range(15):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            graph.replay()
            torch.cuda.synchronize()
            replay.append(time.perf_counter() - t0)
        row["graph_s"] = statistics.median(replay)
        row["exposed_per_expert_s"] = (row["eager_s"] - row["graph_s"]) / experts
    except RuntimeError as err:
        row["graph_error"] = str(err)[:200]
    return row


def expert_host(dev, smoke, label):
    """Exposed host seconds per local expert: (eager after a sync) - (CUDA-graph replay), per expert."""
    rows = []
    hidden, ffn = (128, 64) if smoke else (4096, 1536)   # Qwen3-235B-A22B's expert (hidden 4096, moe ffn 1536)
    cases = [(4, 64)] if smoke else [(e, t) for e in (4, 8, 16, 32) for t in (128, 512, 2048)]
    for grouped in (False, True):
        for e, t in cases:
            try:
                run, flops = expert_mlp(dev, hidden, ffn, e, t, grouped)
            except (RuntimeError, AttributeError, TypeError) as err:
                rows.append(dict(path="grouped_mm" if grouped else "per_expert", experts=e, tokens=t,
                                 error=str(err)[:200]))
                continue
            rows.append(dict(path="grouped_mm" if grouped else "per_expert", blas=label, experts=e, tokens=t,
                             hidden=hidden, ffn=ffn, flops=flops, **exposed_host(dev, run, e)))
        log("expert", label, "grouped" if grouped else "per_expert",
            [(r["experts"], r["tokens"], round(1e6 * r.get("exposed_per_expert_s", 0), 1)) for r in rows[-len(cases):]])
    # the host cost of one call, GPU idle: a small GEMM and a small add, issued back to back
    a = torch.randn(64, 64, device=dev, dtype=torch.bfloat16)
    o = torch.empty_like(a)
    for name, fn in (("mm", lambda: torch.mm(a, a, out=o)), ("add", lambda: torch.add(a, a, out=o)),
                     ("split16", lambda: torch.split(a, [4] * 16))):
        for _ in range(50):
            fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(500):
            fn()
        rows.append(dict(path="call", blas=label, op=name, host_s=(time.perf_counter() - t0) / 500))
        if dev.type == "cuda":
            torch.cuda.synchronize()
    log("calls", label, [(r["op"], round(r["host_s"] * 1e6, 2)) for r in rows if r["path"] == "call"])
    return rows


def fp8_gemms(dev, timer):
    rows = []
    if dev.type != "cuda" or not hasattr(torch, "float8_e4m3fn"):
        return rows
    one = torch.tensor(1.0, device=dev)
    for m, n, k in ((4096, 4096, 4096), (8192, 8192, 8192), (16384, 8192, 8192), (16384, 2048, 2048),
                    (16384, 8192, 2048), (16384, 2048, 8192), (16384, 16384, 4096), (8192, 28672, 8192),
                    (8192, 8192, 28672), (4096, 1024, 1024), (16384, 1024, 4096)):
        a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        w = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn)
        try:
            fn = lambda: torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
            t1 = timer.per_call(fn, calls=1, batches=1)
            t = timer.per_call(fn, calls=timer.calls_for(t1), batches=5)
            rows.append(dict(M=m, N=n, K=k, recipe="tensorwise", s=t, tflops=2 * m * n * k / t / 1e12))
        except RuntimeError as e:
            rows.append(dict(M=m, N=n, K=k, error=str(e)[:200]))
    log("fp8", [(r["M"], r["N"], r["K"], round(r.get("tflops", 0))) for r in rows])
    return rows


# -- whole training steps ------------------------------------------------------------------------------------
class Block(torch.nn.Module):
    def __init__(self, h, heads, f):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(h), torch.nn.LayerNorm(h)
        self.qkv, self.proj = torch.nn.Linear(h, 3 * h), torch.nn.Linear(h, h)
        self.fc1, self.fc2 = torch.nn.Linear(h, f), torch.nn.Linear(f, h)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(torch.nn.Module):
    def __init__(self, layers, h, heads, f, vocab, seq):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, h)
        self.pos = torch.nn.Embedding(seq, h)
        self.blocks = torch.nn.ModuleList(Block(h, heads, f) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(h)

    def forward(self, ids):
        x = self.emb(ids) + self.pos.weight[: ids.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return F.linear(self.ln(x), self.emb.weight)  # tied head


def training_steps(dev, smoke, out_dir, vocab=VOCAB, key="training_steps", compiled=False, only=None, fsdp=False):
    """One GPU, eager PyTorch: fp32 parameters, BF16 autocast, SDPA (PyTorch picks the kernel: cuDNN's on
    Hopper), fused AdamW, no recomputation, one micro-batch per step; median step of 6 after 3 warm-up
    steps; the SM clock and power sampled (NVML) through the timed steps."""
    rows = []
    seq = 64 if smoke else 2048
    cases = {"tiny": ((2, 64, 4, 256), 2)} if smoke else {
        "gpt3-350m": (MODELS["gpt3-350m"], 16), "gpt3-760m": (MODELS["gpt3-760m"], 16),
        "gpt3-1.3b": (MODELS["gpt3-1.3b"], 16), "gpt3-2.7b": (MODELS["gpt3-2.7b"], 8)}
    vocab = 512 if smoke else vocab
    if only and not smoke:
        cases = {k: v for k, v in cases.items() if k in only}
    for name, ((layers, h, heads, f), mb) in cases.items():
        torch.manual_seed(0)
        with torch.device(dev):
            model = GPT(layers, h, heads, f, vocab, seq)
        if fsdp:  # FSDP2 as torchtitan applies it: each block, then the root; BF16 compute, FP32 reduction
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for blk in model.blocks:
                fully_shard(blk, mp_policy=mp)
            fully_shard(model, mp_policy=mp)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
        fwd = torch.compile(model) if compiled else model
        ids = torch.randint(0, vocab, (mb, seq), device=dev)
        params = sum(p.numel() for p in model.parameters())

        def step():
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=not fsdp):
                logits = fwd(ids)
            loss = F.cross_entropy(logits.float().view(-1, vocab), ids.view(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        times = []
        sampler = ClockSampler(dev)
        for i in range(9 if not smoke else 2):
            if i == (3 if not smoke else 0):
                sampler.start()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if i >= (3 if not smoke else 0):
                times.append(time.perf_counter() - t0)
        clocks = sampler.stop()
        t = statistics.median(times)
        tokens = mb * seq
        nonemb = params - vocab * h - seq * h
        # model FLOPs per token: 6 N (non-embedding parameters) + 6 V h (the tied head) + 12 L h s (attention,
        # counted in full: the published ranges' convention)
        flops_tok = 6 * nonemb + 6 * vocab * h + 12 * layers * h * seq
        row = dict(model=name, compiled=compiled, fsdp=fsdp, vocab=vocab, micro_batch=mb, seq=seq, params=params,
                   step_s=t, steps=times, clocks=clocks,
                   tokens_per_s=tokens / t, model_tflops=flops_tok * tokens / t / 1e12,
                   mfu_full_989=flops_tok * tokens / t / 989e12)
        if dev.type == "cuda":
            row["max_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
            row["max_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
            row["kernels"] = kernel_breakdown(step)
        rows.append(row)
        log("step", name, f"{t:.3f} s", f"{row['mfu_full_989']:.3f} MFU")
        RESULTS[key] = rows
        save(out_dir)
        model = opt = fwd = None  # freed before the next model is built (its peak memory is its own)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    return rows


class ClockSampler:
    """SM clock (MHz) and power (W) every 20 ms on a thread, between start() and stop()."""

    def __init__(self, dev):
        import threading
        self.samples, self.stop_flag, self.thread, self.nvml = [], threading.Event(), None, None
        if dev.type == "cuda":
            try:
                import pynvml
                pynvml.nvmlInit()
                self.nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device()))
            except Exception:  # noqa: BLE001
                self.nvml = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        p, h = self.nvml
        while not self.stop_flag.is_set():
            try:
                self.samples.append((p.nvmlDeviceGetClockInfo(h, p.NVML_CLOCK_SM), p.nvmlDeviceGetPowerUsage(h) / 1e3))
            except Exception:  # noqa: BLE001
                return
            time.sleep(0.02)

    def start(self):
        if self.nvml:
            self.thread.start()

    def stop(self):
        if not self.nvml:
            return None
        self.stop_flag.set()
        self.thread.join()
        mhz = sorted(m for m, _ in self.samples)
        watts = sorted(w for _, w in self.samples)
        return dict(n=len(mhz), sm_mhz_median=statistics.median(mhz), sm_mhz_min=mhz[0], sm_mhz_max=mhz[-1],
                    power_w_median=statistics.median(watts), power_w_max=watts[-1]) if mhz else None


def duty_sweep(dev, smoke, seconds=6.0):
    """The GEMM rate and SM clock when GEMMs share the time with memory-bound copies: per duty (the GEMMs'
    share of the loop's time), 8,192^3 BF16 products and 1 GiB copies back to back for ``seconds``; each GEMM
    timed by its own CUDA events."""
    n = 256 if smoke else 8192
    x = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    big = torch.empty(2**28 if not smoke else 2**12, device=dev, dtype=torch.float32)  # 1 GiB
    big2 = torch.empty_like(big)
    rows = []
    for gemms, copies in ((8, 0), (6, 2), (4, 4), (2, 6), (1, 8)):
        sampler = ClockSampler(dev)
        sampler.start()
        ev, t0 = [], time.perf_counter()
        while time.perf_counter() - t0 < (0.5 if smoke else seconds):
            pairs = []
            for _ in range(gemms):
                a = torch.cuda.Event(enable_timing=True) if dev.type == "cuda" else None
                b = torch.cuda.Event(enable_timing=True) if dev.type == "cuda" else None
                if a:
                    a.record()
                torch.matmul(x, x, out=y)
                if b:
                    b.record()
                    pairs.append((a, b))
            for _ in range(copies):
                big2.copy_(big)
            if dev.type == "cuda":
                torch.cuda.synchronize()
                ev.extend(a.elapsed_time(b) / 1e3 for a, b in pairs)
        clocks = sampler.stop()
        gemm_s = statistics.median(ev) if ev else None
        rows.append(dict(gemms=gemms, copies=copies, gemm_s=gemm_s,
                         tflops=2 * n**3 / gemm_s / 1e12 if gemm_s else None, clocks=clocks))
        log("duty", gemms, copies, rows[-1]["tflops"], clocks and clocks["sm_mhz_median"],
            clocks and clocks["power_w_median"])
    return rows


def alignment_gemms(dev, timer, smoke):
    """The LM head at vocabularies of every alignment (odd, 2, 4, 8 and 64 elements) and GPT-3 13B's hidden
    5,140 (a multiple of 4, not 8): each layout."""
    rows = []
    m, k = (256, 64) if smoke else (16384, 2048)
    shapes = [(m, v, k) for v in ((501, 502, 504, 512) if smoke else (50257, 50258, 50260, 50264, 50304))]
    if not smoke:
        shapes += [(16384, 5140, 5140), (16384, 20560, 5140), (16384, 5120, 5120), (16384, 20480, 5120)]
    for mm, n, kk in shapes:
        x = torch.randn(mm, kk, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, kk, device=dev, dtype=torch.bfloat16)
        dy = torch.randn(mm, n, device=dev, dtype=torch.bfloat16)
        for layout, fn, (gm, gn, gk) in (("TN", lambda: F.linear(x, w), (mm, n, kk)),
                                         ("NN", lambda: dy @ w, (mm, kk, n)), ("NT", lambda: dy.t() @ x, (n, kk, mm))):
            t1 = timer.per_call(fn, calls=1, batches=1)
            t = timer.per_call(fn, calls=timer.calls_for(t1), batches=5)
            rows.append(dict(tokens=mm, out=n, inp=kk, layout=layout, M=gm, N=gn, K=gk, s=t,
                             tflops=2 * gm * gn * gk / t / 1e12))
    log("align", [(r["out"], r["inp"], r["layout"], round(r["tflops"])) for r in rows])
    return rows


def kernel_breakdown(step):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    by_name = {}
    for ev in prof.events():
        dt = getattr(ev, "device_type", None)
        if dt is None or "CUDA" not in str(dt):
            continue
        try:
            us = ev.time_range.elapsed_us()
        except AttributeError:
            us = 0.0
        k = by_name.setdefault(ev.name[:120], [0, 0.0])
        k[0] += 1
        k[1] += us
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])
    return {"total_us": sum(v[1] for _, v in top), "top": [(n, c, us) for n, (c, us) in top[:60]]}


def run_sections(out_dir, sections) -> None:
    """Each (name, fn) in turn, its result (or its error: one section failing keeps the others') and seconds
    saved as it ends."""
    for name, fn in sections:
        t0 = time.perf_counter()
        try:
            RESULTS[name] = fn()
        except Exception as e:  # noqa: BLE001
            RESULTS[name] = {"error": repr(e)[:500]}
            log("FAILED", name, repr(e)[:300])
        RESULTS.setdefault("section_s", {})[name] = time.perf_counter() - t0
        save(out_dir)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--soak-s", type=float, default=30.0)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    timer = Timer(dev)
    if args.only == "round2":  # the second device run: padded vocabulary, alignment, clocks in training
        RESULTS["environment"] = environment(dev)
        run_sections(args.out, (("alignment", lambda: alignment_gemms(dev, timer, args.smoke)),
                                ("training_steps_padded", lambda: training_steps(
                                    dev, args.smoke, args.out, vocab=50304, key="training_steps_padded"))))
        return
    if args.only == "round3":  # the third: compiled steps (fused memory-bound kernels) and the clock by duty
        RESULTS["environment"] = environment(dev)
        run_sections(args.out, (("duty_sweep", lambda: duty_sweep(dev, args.smoke)),
                                ("training_steps_compiled", lambda: training_steps(
                                    dev, args.smoke, args.out, vocab=50304, key="training_steps_compiled",
                                    compiled=True, only=("gpt3-350m", "gpt3-1.3b")))))
        return
    if args.only == "round4":  # the fourth: FSDP2 (world size 1) steps, the per-expert loop from C++
        RESULTS["environment"] = environment(dev)
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=0, world_size=1)
        if dev.type == "cuda":
            torch.cuda.set_device(0)
        run_sections(args.out, (("expert_host_cpp", lambda: expert_host_cpp(dev, args.smoke)),
                                ("training_steps_fsdp2", lambda: training_steps(
                                    dev, args.smoke, args.out, vocab=50304, key="training_steps_fsdp2", fsdp=True))))
        dist.destroy_process_group()
        return
    if args.only == "expert_host_lt":  # a child process: cuBLASLt chosen before the first GEMM
        RESULTS["expert_host_cublaslt"] = expert_host(dev, args.smoke, "cublaslt")
        with open(os.path.join(args.out, "expert_lt.json"), "w") as f:
            json.dump(RESULTS["expert_host_cublaslt"], f)
        return
    RESULTS["environment"] = environment(dev)
    save(args.out)
    sections = (("gemm_bf16", lambda: gemm_sweep(dev, timer, torch.bfloat16, args.smoke)),
                ("expert_host_cublas", lambda: expert_host(dev, args.smoke, "cublas")),
                ("training_steps", lambda: training_steps(dev, args.smoke, args.out)),
                ("attention", lambda: attention(dev, timer, args.smoke)),
                ("memory_bound", lambda: memory_bound(dev, timer, args.smoke)),
                ("fp8", lambda: fp8_gemms(dev, timer)),
                ("soak", lambda: soak(dev, 2.0 if args.smoke else args.soak_s, args.smoke)))
    run_sections(args.out, sections)
    t0 = time.perf_counter()
    env = dict(os.environ, TORCH_BLAS_PREFER_CUBLASLT="1")
    cmd = [sys.executable, __file__, "--out", args.out, "--only", "expert_host_lt"]
    cmd += ["--smoke"] if args.smoke else []
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    print(r.stdout[-3000:], r.stderr[-2000:], flush=True)
    try:
        with open(os.path.join(args.out, "expert_lt.json")) as f:
            RESULTS["expert_host_cublaslt"] = json.load(f)
    except OSError as e:
        RESULTS["expert_host_cublaslt"] = {"error": repr(e)}
    RESULTS["section_s"]["expert_host_cublaslt"] = time.perf_counter() - t0
    save(args.out)
    log("done", RESULTS["section_s"])


if __name__ == "__main__":
    main()
