"""Frontends: capture PyTorch and Hugging Face models into the operator-graph IR.

torch is an optional extra: importing this package never imports torch; ``capture_module`` and
``capture_hf`` import it when called.

    capture_module(module, example_inputs)   any nn.Module, via torch.export on fake tensors
    capture_hf(config, micro_batch, seq)     a Hugging Face LLaMA / Qwen2 / Mixtral / GPT-2 built from a
                                             config (object, dict, config.json, preset), or a
                                             ``package.module:factory`` returning (module, inputs)
"""

from __future__ import annotations

from symtensor.frontends.lower import CaptureWarning  # defined where it is raised


def capture_module(module, example_inputs, name: str | None = None, fake: bool = True):
    """See :func:`symtensor.frontends.capture.capture_module`."""
    from symtensor.frontends.capture import capture_module as _capture

    return _capture(module, example_inputs, name=name, fake=fake)


def capture_hf(config_or_path, micro_batch: int = 1, seq: int | None = None, **kw):
    """See :func:`symtensor.frontends.hf.capture_hf`."""
    from symtensor.frontends.hf import capture_hf as _capture_hf

    return _capture_hf(config_or_path, micro_batch=micro_batch, seq=seq, **kw)


__all__ = ["CaptureWarning", "capture_hf", "capture_module"]
