"""The only code in Forge that talks to a container engine: one module per engine behind `Engine` (base.py)."""

from builders.engine import select as _select  # noqa: F401  (registers how Engine.connect chooses)
from builders.engine.base import Builder, BuildRequest, BuildResult, Engine, EngineFacts, ImageInfo
from builders.engine.image_builders import choose_builder

__all__ = ["BuildRequest", "BuildResult", "Builder", "Engine", "EngineFacts", "ImageInfo", "choose_builder"]
