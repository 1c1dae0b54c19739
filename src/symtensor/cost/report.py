"""What one plan costs: the evaluator's answer (``cost.model``), read by the search, the plans and
the reports."""

from __future__ import annotations

from dataclasses import dataclass, field

from symtensor.cost.memory import peak_terms
from symtensor.hardware import GIB


@dataclass
class CostReport:
    """What one plan costs. Times in seconds, memory in bytes, volumes in bytes per device per step."""

    step_time_s: float
    breakdown: dict[str, float]
    memory: dict[str, float]
    memory_peak: float
    capacity: float
    fits: bool
    model_flops: float
    tokens: int
    n_devices: int
    peak_flops: float
    comm_bytes: dict[str, float] = field(default_factory=dict)
    stage_times_s: list[float] = field(default_factory=list)
    # the device's reserved peak (``cost.memory``: allocated + fragmentation + CUDA context + NCCL), what
    # nvidia-smi shows and ``fits`` judges; ``memory_peak`` is the allocated peak
    memory_reserved: float = 0.0

    @property
    def overflow(self) -> str:
        """Why it does not fit, in the words every plan and baseline uses: the reserved peak ``fits`` judges."""
        return f"does not fit: {self.memory_reserved / GIB:.1f} GiB per device (reserved)"

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_time_s

    @property
    def model_tflops_per_device(self) -> float:
        return self.model_flops / self.step_time_s / self.n_devices / 1e12

    @property
    def mfu(self) -> float:
        return self.model_flops / self.step_time_s / self.n_devices / self.peak_flops

    def as_dict(self) -> dict:
        return {
            "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
            "model_tflops_per_device": self.model_tflops_per_device, "mfu": self.mfu,
            "memory_gib_per_device": self.memory_peak / GIB,
            "memory_reserved_gib_per_device": self.memory_reserved / GIB, "capacity_gib": self.capacity / GIB,
            "fits": self.fits, "breakdown": dict(self.breakdown),
            "memory_gib": {k: v / GIB for k, v in self.memory.items()},
            "memory_terms_gib": {k: v / GIB for k, v in peak_terms(self.memory).items()},
            "comm_bytes_per_device": dict(self.comm_bytes),
        }
