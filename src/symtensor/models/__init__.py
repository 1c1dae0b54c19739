"""Model zoo, Hugging Face config loading and graph builders."""

from symtensor.models.builder import build_graph, build_model, params_active
from symtensor.models.config import PRESETS, ModelConfig, apply_overrides
from symtensor.models.hf_config import from_hf_dict, load_model_config

__all__ = ["PRESETS", "ModelConfig", "apply_overrides", "build_graph", "build_model", "from_hf_dict",
           "load_model_config", "params_active"]
