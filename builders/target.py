"""The target, resolved once: what building a recipe on a distro with the given options means.

Plan, preflight, build and CI rendering ask this object — "does it compile?", "is it a CUDA image?" — instead of
re-deciding from recipe.kind and recipe.device in each module (issue 14), so a new device or mode is decided
here, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from builders.config.engines import engine_package
from builders.config.models import Distro, GpuMode, Recipe


def engine_module(recipe: Recipe) -> str:
    """The module that plans, preflights and tests a kind=native recipe, named by its engine (llama-cpp →
    builders/engines/llama_cpp/image.py)."""
    return f"{engine_package(recipe.engine)}.image"


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
        """VLLM_TARGET_DEVICE: which of vLLM's requirement files and torch pins apply."""
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
        """vLLM's CPU backend: the ISA settings apply, and the image gets a smoke test."""
        return self.recipe.device == "cpu"

    @property
    def smokes(self) -> bool:
        """A vLLM CPU image that serves in its test stage: smoke and sweep sessions and CI's smoke step run the ci
        profile (vLLM pools) on it. A native engine's image serves too, but its pools need its own profile
        (ci-llama, ci-sglang) and option (--llama-image, --sglang-image)."""
        return self.cpu and self.recipe.serve_test and not self.native

    @property
    def runs_vllm(self) -> bool:
        """The image carries vLLM (not the router alone): a toolchain, tcmalloc and the base probe matter."""
        return self.recipe.device != "none" and not self.native

    @property
    def native(self) -> bool:
        """Another engine's C/C++ server (llama.cpp): its module in builders/engines/ plans, preflights and tests
        it, so none of the vLLM phases above apply."""
        return self.recipe.kind == "native"

    @property
    def engine_module(self) -> str:
        return engine_module(self.recipe)

    @property
    def compiles(self) -> bool:
        """vLLM is compiled from its sdist here; a GPU build in wheel mode installs PyPI's CUDA wheel instead."""
        return self.recipe.kind == "source" and self.gpu_mode != "wheel"

    @property
    def from_sdist(self) -> bool:
        """vLLM's sdist and the sources it pins are this recipe's inputs: locked even when a GPU build in wheel
        mode will not compile them, so one forge.lock serves both modes."""
        return self.recipe.kind == "source"

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
