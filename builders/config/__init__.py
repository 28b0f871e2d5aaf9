"""Distros, recipes and other YAML data, validated into frozen models."""

from builders.config.loading import load_model, validation_error_to_config_error
from builders.config.models import Distro, Recipe
from builders.config.project import Project

__all__ = ["Distro", "Project", "Recipe", "load_model", "validation_error_to_config_error"]
