"""The only code in Forge that talks to a container engine (Docker, or Podman's Docker-compatible socket)."""

from builders.engine.docker_engine import Engine, ImageInfo
from builders.engine.image_builders import Builder, BuildRequest, BuildResult, choose_builder

__all__ = ["BuildRequest", "BuildResult", "Builder", "Engine", "ImageInfo", "choose_builder"]
