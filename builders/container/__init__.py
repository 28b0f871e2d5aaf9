"""The only code in Forge that talks to a container engine: one module per engine behind `Engine` (base.py)."""

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
from builders.container.select import connect

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
    "connect",
]
