"""Stack profiles as smoke, sweep and deploy load them: profiles/<name>.yaml (or a path) validated by the models
of builders/config/profile.py, each pool by its serving engine's own model from the registry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from builders.config.loading import load_yaml
from builders.config.profile import PoolSettings, StackProfile, _suggest
from builders.config.profile import profile_from_mapping as _validated
from builders.engines import ENGINES
from builders.errors import UsageError
from builders.input_files import refuse_special
from builders.project import file_name

__all__ = ["PoolSettings", "StackProfile", "_suggest", "available_profiles", "load_profile", "profile_from_mapping"]


def profile_from_mapping(data: Any, *, source: str, name: str) -> StackProfile:
    """Validate parsed YAML, each pool by its engine's model; every error names `source`, the key path and, for a
    typo, the intended key."""
    return _validated(data, source=source, name=name, pools=ENGINES.pool_models())


def profiles_dir(root: Path) -> Path:
    return root / "profiles"


def available_profiles(root: Path) -> list[str]:
    return sorted(p.stem for p in profiles_dir(root).glob("*.yaml"))


def load_profile(name_or_path: str, *, root: Path) -> tuple[StackProfile, Path]:
    """A profile by name (profiles/NAME.yaml under `root`) or by path to a YAML file."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or "/" in name_or_path:
        path = candidate
    else:
        path = profiles_dir(root) / f"{name_or_path}.yaml"
    if path.exists() and not path.is_file():
        # /dev/zero is there, but no profile: say what it is rather than that it is missing.
        refuse_special(path, what="profile", hint="pass a profile name or the path of a YAML file")
    if not path.is_file():
        known = available_profiles(root)
        raise UsageError(
            f"no profile {name_or_path!r} (looked for {path}){_suggest(name_or_path, known)}",
            hint=f"known profiles: {', '.join(known) or 'none'}; or pass a path to a YAML file",
        )
    # The stem names the containers, reports and Kubernetes objects of a run: held to the names distros get.
    profile = profile_from_mapping(load_yaml(path), source=str(path), name=file_name(path))
    return profile, path
