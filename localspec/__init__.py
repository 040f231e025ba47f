"""localspec: speculative decoding for quantized GGUF models.

The output is the target model's own: identical text at temperature 0, the same
distribution at temperature > 0. See README.md for the CLI and the Python API.
"""

from localspec.errors import LocalspecError
from localspec.types import Chunk, EngineInfo, GenerationParams, GenerationResult, GenerationStats

__all__ = [
    "Chunk",
    "Engine",
    "EngineInfo",
    "GenerationParams",
    "GenerationResult",
    "GenerationStats",
    "LocalspecError",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # The engine needs the compiled core; import it lazily so that pure-Python modules
    # (planner, registry, types) work without touching llama.cpp.
    if name == "Engine":
        from localspec.runtime.engine import Engine

        return Engine
    raise AttributeError(name)
