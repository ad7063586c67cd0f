"""The whole Qwen3.6 (Qwen3.5-MoE layout) / Qwen3-Next text model built from model's blocks."""
from .config import ConfigError, Qwen36Config
from .model import Qwen36Cache, Qwen36Model, Qwen36Paths
from .static_cache import StaticDecodeCache
from .static_step import CapturableDecodeStep
from .weights import DenseMLPWeights, LayerWeights, Qwen36Weights, load_safetensors_dir

__all__ = [
    "CapturableDecodeStep",
    "ConfigError",
    "DenseMLPWeights",
    "LayerWeights",
    "Qwen36Cache",
    "Qwen36Config",
    "Qwen36Model",
    "Qwen36Paths",
    "Qwen36Weights",
    "StaticDecodeCache",
    "load_safetensors_dir",
]
