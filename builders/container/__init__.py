"""The only code in Forge that talks to a container engine: one module per engine behind `Engine` (base.py)."""

from builders.container import select as _select  # noqa: F401  (registers how Engine.connect chooses)
from builders.container.base import (
    Builder,
    BuildRequest,
    BuildResult,
    Engine,
    EngineChoice,
    EngineFacts,
    ImageInfo,
    RunSpec,
)
from builders.container.image_builders import choose_builder

__all__ = [
    "BuildRequest",
    "BuildResult",
    "Builder",
    "Engine",
    "EngineChoice",
    "EngineFacts",
    "ImageInfo",
    "RunSpec",
    "choose_builder",
]
