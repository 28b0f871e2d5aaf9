"""The only code in Forge that talks to a container engine: one module per engine behind `Engine` (base.py)."""

from builders.engine.base import Engine, EngineFacts, ImageInfo
from builders.engine.image_builders import Builder, BuildRequest, BuildResult, choose_builder

__all__ = ["BuildRequest", "BuildResult", "Builder", "Engine", "EngineFacts", "ImageInfo", "choose_builder"]
