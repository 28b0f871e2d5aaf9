"""Distros, recipes, profiles and other YAML data, validated into frozen models: the common part of each, which
a serving engine's package extends with its own keys (builders/project.py loads the project's files with them)."""

from builders.config.loading import load_model, validation_error_to_config_error
from builders.config.models import Distro, Recipe

__all__ = ["Distro", "Recipe", "load_model", "validation_error_to_config_error"]
