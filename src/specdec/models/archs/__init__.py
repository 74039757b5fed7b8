"""The architectures the native backend runs: one file each (its config from the GGUF metadata, its flags), one
runner for all (``specdec.models.native``). Adding one: its file, and a line in :data:`ARCHS`."""

from __future__ import annotations

from . import gemma3, granite, llama, phi3, qwen2, qwen3
from .config import ModelConfig, refuse

ARCHS = {"qwen2": qwen2.read_config, "llama": llama.read_config, "qwen3": qwen3.read_config,
         "gemma3": gemma3.read_config, "phi3": phi3.read_config, "granite": granite.read_config}
SUPPORTED_ARCHS = tuple(ARCHS)


def read_config(file) -> ModelConfig:
    """The model's config from a GGUFFile's metadata; an architecture not in :data:`ARCHS` is refused in one line."""
    arch = file.field("general.architecture")
    if arch not in ARCHS:
        raise refuse(file, f"architecture {arch!r} is not supported by the native backend "
                           f"(supported: {', '.join(SUPPORTED_ARCHS)})")
    return ARCHS[arch](file)
