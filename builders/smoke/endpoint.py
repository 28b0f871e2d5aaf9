"""`forge smoke --endpoint URL`: a profile's six classes and their gates against a stack Forge did not start.

Nothing is started and nothing is left: the endpoint is asked whether it answers, then the profile's traffic
plan runs against it and each class is judged by the profile's SLOs, as in a smoke run Forge starts itself.
Where each request was served comes from the router's response headers (x-forge-pool, x-forge-replica); an
endpoint that sends none is not a Forge router, and the report says so rather than guessing.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
import unicodedata
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import requests
from rich.console import Console

from builders.config.profile import StackProfile
from builders.config.types import unseen_character
from builders.errors import SmokeFailed, UsageError
from builders.records import write_text
from builders.redact import mask_url, mask_urls
from builders.smoke.report import ClassRecord, EndpointInfo, EndpointReport, Gates, TrafficRecord, TrafficRecords
from builders.smoke.stack import traffic_plan
from builders.traffic.results import TrafficResult
from builders.traffic.runner import run_traffic

# The first question to the endpoint: a dead or wrong URL must fail in seconds, not after a traffic run.
REACH_TIMEOUT_S = 3.0


@dataclass(frozen=True, kw_only=True)
class EndpointOptions:
    profile: StackProfile
    profile_path: Path
    url: str
    api_key: str | None = None
    model: str | None = None
    report_dir: Path | None = None


def check_url(url: str) -> str:
    """The endpoint's base URL (scheme://host:port, user-info kept for the connection), or a UsageError that
    quotes the URL with its user-info masked."""
    shown = mask_url(url)
    example = "give the router's base URL, e.g. http://forge-ci-router:8000"
    found = unseen_character(url)
    if found is not None:
        # urlsplit drops tabs and line breaks without a word: the URL used would not be the one given.
        raise UsageError(f"--endpoint {shown!r} holds {found}", hint=example)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is no number or out of range
    except ValueError as exc:
        raise UsageError(f"--endpoint {shown!r} is not a URL: {exc}", hint=example) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--endpoint {shown!r} is not a base URL like http://forge-ci-router:8000")
    if parts.path.rstrip("/") not in ("", "/v1"):
        raise UsageError(f"--endpoint {shown!r} has a path; give the router's base URL (with or without /v1)")
    return f"{parts.scheme}://{parts.netloc}"


def check_api_key(key: str, *, where: str) -> str:
    """A Bearer key is one word of visible ASCII (RFC 6750): anything else fails in the HTTP header and would read
    as an endpoint that cannot be reached. The key itself is never printed, only what is wrong with it."""
    bad = next((c for c in key if not 0x21 <= ord(c) <= 0x7E), None)
    if key and bad is None:
        return key
    if not key:
        what = "is empty"
    elif bad == " ":
        what = "holds a blank"
    else:
        assert bad is not None
        what = "holds " + (unseen_character(bad) or f"U+{ord(bad):04X} ({unicodedata.name(bad, '?').lower()})")
    raise UsageError(
        f"{where}: the key {what}; a Bearer key is one word of visible ASCII characters",
        hint="pass the key exactly as the router's Secret holds it (kubectl get secret forge-PROFILE-keys)",
    )


def reach(url: str, api_key: str | None, model: str) -> EndpointInfo:
    """What the endpoint says before traffic: its /health (a Forge router's lists its pools) and /v1/models.
    SmokeFailed at once when it cannot be reached, refuses the key or does not serve the model."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url_shown = mask_url(url)
    try:
        health = requests.get(f"{url}/health", timeout=REACH_TIMEOUT_S)
        models = requests.get(f"{url}/v1/models", headers=headers, timeout=REACH_TIMEOUT_S)
    except requests.Timeout:
        raise SmokeFailed(
            f"endpoint {url_shown} did not answer within {REACH_TIMEOUT_S:.0f}s",
            hint="check the URL and that the router's Service is reachable from here (kubectl port-forward "
            "svc/forge-PROFILE-router 8000)",
        ) from None
    except requests.RequestException as exc:
        # The innermost reason ("[Errno 111] Connection refused", "Name or service not known"), not urllib3's chain.
        found = re.search(r"\[Errno -?\d+\] [^'\")]+", str(exc))
        raise SmokeFailed(
            f"endpoint {url_shown} cannot be reached: {found.group(0) if found else type(exc).__name__}",
            hint="check the URL and that the router's Service is reachable from here (kubectl port-forward "
            "svc/forge-PROFILE-router 8000)",
        ) from None
    if models.status_code in (401, 403):
        raise SmokeFailed(
            f"endpoint {url_shown} refused the API key (HTTP {models.status_code} on /v1/models)",
            hint="pass --api-key with the router's key (the api-key entry of the forge-PROFILE-keys Secret)",
        )
    if models.status_code != 200:
        raise SmokeFailed(f"endpoint {url_shown}: /v1/models answered HTTP {models.status_code}: {models.text[:300]}")
    try:
        served = sorted({str(m.get("id")) for m in models.json().get("data", [])})
    except (ValueError, AttributeError):
        raise SmokeFailed(f"endpoint {url_shown}: /v1/models did not answer an OpenAI model list") from None
    if model not in served:
        raise SmokeFailed(
            f"endpoint {url_shown} does not serve model {model!r} (it lists {', '.join(served) or 'none'})",
            hint="pass --model with one it serves, or deploy the profile's model",
        )
    info = EndpointInfo(models=served, health_status=health.status_code)
    try:
        body = health.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("pools"), dict):
        # Another server's /health is not ours to trust: only string URLs are kept.
        info.pools = {
            str(name): [u if isinstance(u := r.get("url"), str) else None for r in replicas if isinstance(r, dict)]
            for name, replicas in body["pools"].items()
            if isinstance(replicas, list)
        }
    return info


def served_where(result: TrafficResult) -> dict[str, dict[str, int]]:
    """For each class, how many requests each pool/replica answered, from the response headers."""
    where: dict[str, Counter[str]] = {c.value: Counter() for c in result.summaries}
    for record in result.records:
        if record.status is None:
            continue
        key = f"{record.pool}/{record.replica}" if record.pool else "(no x-forge-pool header)"
        where[record.request_class.value][key] += 1
    return {c: dict(sorted(counts.items())) for c, counts in where.items()}


def smoke_endpoint(options: EndpointOptions, console: Console) -> EndpointReport:
    """Run the profile's traffic against the endpoint and judge it; SmokeFailed (after writing the report) when a
    gate fails."""
    profile = options.profile
    source = str(options.profile_path)
    url = check_url(options.url)
    plan = traffic_plan(profile, source)
    if options.model is not None:
        plan = plan.model_copy(update={"model": options.model})
    run_id = secrets.token_hex(4)
    started = time.time()
    report = EndpointReport(
        run_id=run_id,
        profile=profile.name,
        profile_file=source,
        endpoint=mask_url(url),
        started_at=datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
    )
    try:
        report.endpoint_info = reach(url, options.api_key, plan.model)
        console.print(f"endpoint {mask_url(url)} answers; traffic: up to {plan.max_total_requests} requests")
        bound = profile.timeouts.traffic_s

        async def bounded() -> TrafficResult:
            async with asyncio.timeout(bound):
                return await run_traffic(url, plan, api_key=options.api_key)

        try:
            result = asyncio.run(bounded())
        except TimeoutError:
            raise SmokeFailed(
                f"traffic against {mask_url(url)} did not finish within timeouts.traffic_s={bound:.0f}s",
                hint="lower traffic.deadline_s or raise timeouts.traffic_s",
            ) from None
        console.print(result.render_table())
        where = served_where(result)
        classes = {
            c.value: ClassRecord.of(summary, pool=profile.classes[c], served_where=where[c.value])
            for c, summary in result.summaries.items()
        }
        report.traffic = TrafficRecords(
            main=TrafficRecord(
                wall_s=round(result.wall_s, 2),
                stopped_by=result.stopped_by,
                requests=len(result.records),
                classes=classes,
            )
        )
        unlabelled = sum(v for c in where.values() for k, v in c.items() if k.startswith("(no "))
        if unlabelled:
            report.note = f"{unlabelled} answer(s) carried no x-forge-pool header: the endpoint is not a Forge router"
        failures = [
            f"{c.value}: {'; '.join(s.gate_failures)}" for c, s in result.summaries.items() if not s.gate_passed
        ]
        report.gates = Gates(passed=not failures, failures=failures)
        if failures:
            raise SmokeFailed(
                f"profile {profile.name} against {mask_url(url)}: {len(failures)} gate(s) failed:\n  "
                + "\n  ".join(failures),
                hint="the report names each class's numbers and where it was served",
            )
    finally:
        report.duration_s = round(time.time() - started, 1)
        if options.report_dir is not None:
            path = options.report_dir / f"smoke-endpoint-{profile.name}-{run_id}.json"
            # Error texts of the traffic run may quote the URL: the whole report is masked as it is written.
            write_text(path, mask_urls(report.to_json()) + "\n")
            report.report_file = str(path)
    return report
