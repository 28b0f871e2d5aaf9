"""What both of SGLang's image plans start from, resolved once by image.py: its own module, since image.py imports
the two plans (cpu_image.py, gpu_image.py) that read it."""

from __future__ import annotations

from dataclasses import dataclass

from builders.config.models import Distro, Recipe
from builders.plan import PlanOptions


@dataclass(frozen=True, kw_only=True)
class PlanInputs:
    """The distro, recipe and options of one plan, the torch release it pins, the labels every SGLang image carries
    and the BuildPlan fields both plans fill alike (`common`)."""

    distro: Distro
    recipe: Recipe
    options: PlanOptions
    torch_version: str
    labels: dict[str, str]
    common: dict[str, object]
