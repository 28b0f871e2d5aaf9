"""The target, resolved once: what building a recipe on a distro with the given options means.

Plan, preflight, build and CI rendering ask this object — "does it compile?", "is it a CUDA image?" — instead of
re-deciding from recipe.kind and recipe.device in each module (issue 14), so a new device or mode is decided
here, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from builders.config.models import Distro, GpuMode, Recipe


@dataclass(frozen=True, kw_only=True)
class Target:
    distro: Distro
    recipe: Recipe
    gpu_mode: GpuMode | None  # CUDA targets on a distro with a cuda section: wheel or source; else None

    @classmethod
    def resolve(cls, distro: Distro, recipe: Recipe, *, gpu_mode: GpuMode | None = None) -> Target:
        """gpu_mode: --gpu-mode, overriding the recipe's cuda.mode."""
        mode = None
        if recipe.device == "cuda" and recipe.cuda is not None and distro.cuda is not None:
            mode = gpu_mode or recipe.cuda.mode
        return cls(distro=distro, recipe=recipe, gpu_mode=mode)

    @property
    def device(self) -> Literal["cpu", "cuda", "none"]:
        """What the image computes on: cpu, cuda, or none (the router)."""
        return self.recipe.device

    @property
    def kind(self) -> Literal["source", "wheel", "python-app", "native"]:
        """How the recipe gets its software, as CI's matrix reports it and sizes its timeout."""
        return self.recipe.kind

    @property
    def cuda(self) -> bool:
        return self.recipe.device == "cuda"

    @property
    def cpu(self) -> bool:
        """A CPU image: the ISA settings apply, and the image gets a smoke test."""
        return self.recipe.device == "cpu"

    @property
    def smokes(self) -> bool:
        """A CPU image that serves in its test stage and is not a native engine's: smoke and sweep sessions and CI's
        smoke step run the ci profile (vLLM pools) on it. A native engine's image serves too, but its pools need their
        own profile (ci-llama, ci-sglang) and option (--llama-image, --sglang-image)."""
        return self.cpu and self.recipe.serve_test and self.recipe.kind != "native"

    @property
    def native(self) -> bool:
        """A C/C++ server built from a pinned archive (llama.cpp, SGLang): compiled here for the CPU, or installed
        from its wheels for CUDA."""
        return self.recipe.kind == "native"

    @property
    def compiles(self) -> bool:
        """Compiled from its sdist here; a GPU build in wheel mode installs PyPI's CUDA wheel instead."""
        return self.recipe.kind == "source" and self.gpu_mode != "wheel"

    @property
    def from_sdist(self) -> bool:
        """The sdist and the sources it pins are this recipe's inputs: locked even when a GPU build in wheel mode
        will not compile them, so one forge.lock serves both modes."""
        return self.recipe.kind == "source"

    @property
    def pinned_source(self) -> bool:
        """The recipe's pinned source archive is an input of its image (compiled from it, or, for a GPU build in
        wheel mode, read for what the wheel's release requires): fetched, locked and preflighted."""
        return self.recipe.kind in {"source", "native"}

    @property
    def gpu_wheel(self) -> bool:
        return self.gpu_mode == "wheel"

    @property
    def from_wheelhouse(self) -> bool:
        """A runtime image assembled from existing wheels (the cpu-wheel recipe)."""
        return self.recipe.kind == "wheel"

    @property
    def python_app(self) -> bool:
        """Forge's own Python package as the image (the router)."""
        return self.recipe.kind == "python-app"

    @property
    def installs_torch(self) -> bool:
        return self.recipe.kind in {"source", "wheel"}
