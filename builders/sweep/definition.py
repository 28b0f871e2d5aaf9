"""Which profiles a sweep compares, and the guarantee that they are compared fairly.

Sweep profiles live in profiles/sweep/: `common.yaml` holds what every profile must share (model, traffic,
SLOs, timeouts), each other file the pools, class map and router settings of one profile. A profile is its
file merged over common.yaml, so the traffic is the same by construction; the CPU budget (the cores all
replicas are confined to, counted per replica) is checked to be equal before anything starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from builders.config.loading import load_yaml
from builders.config.profile import PoolSettings, StackProfile, _suggest
from builders.cpusets import parse_cpuset
from builders.engines import ENGINES
from builders.errors import ConfigError, UsageError
from builders.smoke.profile import profile_from_mapping
from builders.smoke.stack import merged

COMMON = "common.yaml"
# Keys a sweep profile may not set itself: they are what makes the comparison fair.
SHARED_KEYS = ("model", "traffic", "sweep")
SETTINGS_KEY = "sweep"
# A profile's changes for running it on another serving engine (`engines: {llama-cpp: {pools: ...}}`).
ENGINES_KEY = "engines"


class SweepSettings(BaseModel):
    """How a sweep sizes its load and when it calls its own result invalid (common.yaml's `sweep` section)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    calibrate: bool = Field(
        default=True,
        description="Measure one replica first and scale every open-loop rate so that the estimated work is "
        "load_fraction of the profile's replicas' capacity (builders/sweep/calibrate.py).",
    )
    load_fraction: float = Field(
        default=0.5, gt=0, le=4, description="Offered load as a fraction of the measured capacity."
    )
    max_scale: float = Field(
        default=4.0, gt=0, description="Largest factor calibration may raise the configured rates by."
    )
    min_scale: float = Field(
        default=0.01, gt=0, description="Smallest factor calibration may lower the configured rates by."
    )
    min_arrivals: int = Field(
        default=8,
        ge=1,
        description="Calibration thins no open-loop class below this many arrivals in the window (or the class's "
        "own count): what thinning may not remove comes off the model's size (builders/sweep/calibrate.py).",
    )
    max_window_s: float = Field(
        default=120.0,
        gt=0,
        description="How long calibration may stretch the traffic window so that thinned classes keep min_arrivals.",
    )
    calibrate_per_engine: bool = Field(
        default=True,
        description="With profiles on several serving engines (--engines), calibrate each engine on its own first "
        "replica, so that each is offered load_fraction of its own capacity; false: every engine gets the load "
        "sized for the first one measured.",
    )
    resize_model: bool = Field(
        default=True,
        description="Let calibration shrink the model (layers, then hidden size) when thinning alone would not "
        "bring the load down to load_fraction; the profile is then started again with the smaller model.",
    )
    served_floor: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="The run is invalid when the reference profile answers fewer than this fraction of the "
        "requests it was sent without error: then every profile was overloaded and the table ranks failures.",
    )


def sweep_dir(root: Path) -> Path:
    return root / "profiles" / "sweep"


# The field's comparison, reference first, then the work-conserving profile; others follow by name.
ORDER = ("shared", "throughput", "latency", "prefix-affinity", "slow-isolation", "class-aware", "work-conserving")


def available_sweep_profiles(root: Path) -> list[str]:
    """The profiles of profiles/sweep/, in the order a report lists them."""
    names = {p.stem for p in sweep_dir(root).glob("*.yaml") if p.name != COMMON}
    return [n for n in ORDER if n in names] + sorted(names - set(ORDER))


@dataclass(frozen=True, kw_only=True)
class SweepProfile:
    profile: StackProfile
    path: Path

    @property
    def engine(self) -> str:
        """The serving engine(s) its pools run, as the report's engine column shows them."""
        return "+".join(dict.fromkeys(p.engine for p in self.profile.pools.values()))

    @property
    def cpu_budget(self) -> int:
        """CPUs summed over replicas: what the profile's replicas may use together."""
        return sum(
            len(parse_cpuset(pool.cpuset_of(i) or "")) if pool.cpus else 0
            for pool in self.profile.pools.values()
            for i in range(pool.replicas)
        )


# YAML as parsed, before a model says what its values are.
Parsed = dict[str, object]


def _load_common(directory: Path) -> Parsed:
    path = directory / COMMON
    if not path.is_file():
        raise UsageError(f"no {path}", hint="a sweep needs the shared model and traffic in profiles/sweep/common.yaml")
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a mapping, found {type(data).__name__}")
    return data


def on_engine(data: Parsed, kind: str, *, source: str) -> Parsed:
    """A profile's mapping with every pool moved to serving engine `kind`: the knobs only another engine reads
    are dropped, and the profile's `engines.<kind>` section is merged over the result (its own knobs for
    `kind`). Replicas, CPU sets and the class map stay: the engine is the only thing that changes."""
    sections = data.get(ENGINES_KEY) or {}
    if not isinstance(sections, dict):
        raise ConfigError(f"{source}: {ENGINES_KEY}: must be a mapping of serving engine to profile changes")
    changes = sections.get(kind, {})
    if not isinstance(changes, dict):
        raise ConfigError(f"{source}: {ENGINES_KEY}.{kind}: must be a mapping of profile changes")
    models = ENGINES.pool_models().models
    own = models.get(kind)
    if own is None:
        raise UsageError(
            f"--engines: no serving engine {kind!r}{_suggest(kind, models)}",
            hint=f"serving engines: {', '.join(models)}",
        )
    foreign = {k for name, model in models.items() if name != kind for k in model.model_fields} - set(own.model_fields)
    foreign -= set(PoolSettings.model_fields)
    given = data.get("pools") or {}
    if not isinstance(given, dict):
        raise ConfigError(f"{source}: pools: must be a mapping of pool name to its settings")
    pools = {
        name: {**{k: v for k, v in pool.items() if k not in foreign}, "engine": kind}
        if isinstance(pool, dict)
        else pool
        for name, pool in given.items()
    }
    return merged({**data, "pools": pools}, changes)


def load_sweep(
    names: list[str], *, root: Path, changes: Mapping[str, object] | None = None, engines: list[str] | None = None
) -> list[SweepProfile]:
    """The named profiles of profiles/sweep/ (or YAML paths), each merged over common.yaml and `changes`
    (a shortened run's overrides), checked to share one CPU budget with every replica confined. With
    `engines`, each profile once per serving engine (engine × profile), named PROFILE@ENGINE beyond the
    profile's own."""
    if not names:
        raise UsageError("name at least one profile to sweep", hint="e.g. --profiles shared,class-aware")
    directory = sweep_dir(root)
    common = merged(_load_common(directory), changes or {})
    common.pop(SETTINGS_KEY, None)
    known = available_sweep_profiles(root)
    loaded: list[SweepProfile] = []
    for name in names:
        candidate = Path(name)
        path = candidate if candidate.suffix in (".yaml", ".yml") else directory / f"{name}.yaml"
        if not path.is_file():
            raise UsageError(
                f"no sweep profile {name!r} (looked for {path}){_suggest(name, known)}",
                hint=f"known sweep profiles: {', '.join(known) or 'none'}",
            )
        own = load_yaml(path)
        if not isinstance(own, dict):
            raise ConfigError(f"{path}: a profile must be a mapping, found {type(own).__name__}")
        for key in SHARED_KEYS:
            if key in own:
                raise ConfigError(
                    f"{path}: {key}: a sweep profile may not set its own {key}",
                    hint=f"every profile of a sweep shares {directory / COMMON}'s {key}; change it there",
                )
        data = merged(common, own)
        if not engines:
            data.pop(ENGINES_KEY, None)
            loaded.append(SweepProfile(profile=profile_from_mapping(data, source=str(path), name=path.stem), path=path))
            continue
        as_written = profile_from_mapping(
            {k: v for k, v in data.items() if k != ENGINES_KEY}, source=str(path), name=path.stem
        )
        own_engine = SweepProfile(profile=as_written, path=path).engine
        for kind in engines:
            if kind == own_engine:
                loaded.append(SweepProfile(profile=as_written, path=path))
                continue
            moved = on_engine(data, kind, source=str(path))
            moved.pop(ENGINES_KEY, None)
            profile = profile_from_mapping(moved, source=f"{path} ({ENGINES_KEY}: {kind})", name=f"{path.stem}@{kind}")
            loaded.append(SweepProfile(profile=profile, path=path))
    _check_budget(loaded)
    return loaded


def load_sweep_settings(root: Path, *, changes: Mapping[str, object] | None = None) -> SweepSettings:
    """common.yaml's `sweep` section (with `changes`), validated; errors name the file and key."""
    path = sweep_dir(root) / COMMON
    data = merged(_load_common(sweep_dir(root)), changes or {}).get(SETTINGS_KEY) or {}
    try:
        return SweepSettings.model_validate(data)
    except ValidationError as exc:
        problems = [f"{path}: {SETTINGS_KEY}.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(
            "\n  ".join(problems),
            hint=f"the {SETTINGS_KEY} section takes builders/sweep/definition.py's SweepSettings fields",
        ) from None


def _check_budget(profiles: list[SweepProfile]) -> None:
    for sweep_profile in profiles:
        for name, pool in sweep_profile.profile.pools.items():
            if not pool.cpus:
                raise ConfigError(
                    f"{sweep_profile.path}: pools.{name}.cpus: every replica of a sweep needs a CPU set",
                    hint="without one, replicas share whatever cores are free and profiles are not comparable",
                )
    budgets = {p.path.stem: p.cpu_budget for p in profiles}
    if len(set(budgets.values())) > 1:
        listing = ", ".join(f"{name} {cpus}" for name, cpus in budgets.items())
        raise ConfigError(
            f"the profiles' CPU budgets differ (CPUs summed over replicas: {listing})",
            hint="give every profile the same replicas × cores, or the sweep compares hardware, not policy",
        )
