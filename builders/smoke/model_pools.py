"""Several models behind one router: what each pool's replicas are sent to warm up, and the smoke's check that every
model the profile serves is reached through the router by a request naming it, on a pool that serves it.

The router learns which pool serves which model from the replicas themselves (builders/router/served_models.py);
this check is what proves it, from outside, the way a client would see it.
"""

from __future__ import annotations

import requests

from builders.config.profile import StackProfile
from builders.router.call import HEADER_POOL
from builders.smoke.report import ModelReached, ModelsVerdict


def request_for(profile: StackProfile, pool: str, *, prompt: str, max_tokens: int) -> tuple[str, dict[str, object]]:
    """(path, body) of a request a replica of `pool` serves: an embedding for an embed pool, else a chat turn."""
    model = profile.serves(pool)
    if profile.pools[pool].embeds:
        return "/v1/embeddings", {"model": model, "input": prompt}
    return "/v1/chat/completions", {
        "model": model,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": prompt}],
    }


def warm_up_requests(profile: StackProfile, pool: str) -> list[tuple[str, dict[str, object]]]:
    """What a replica of `pool` is sent before anything is measured: a short chat turn and a prompt of half its
    context, or for an embed pool that prompt as an embedding (it serves neither chat nor completions)."""
    long_prompt = " the" * ((profile.pools[pool].max_model_len or profile.model.max_model_len) // 2)
    if profile.pools[pool].embeds:
        return [request_for(profile, pool, prompt=long_prompt, max_tokens=8)]
    return [
        request_for(profile, pool, prompt="hi", max_tokens=8),
        ("/v1/completions", {"model": profile.serves(pool), "max_tokens": 8, "prompt": long_prompt}),
    ]


def reach_every_model(profile: StackProfile, router_url: str, api_key: str, *, timeout_s: float) -> ModelsVerdict:
    """One request per model through the router; each must get a 200 from a pool that serves its model."""
    models: dict[str, list[str]] = {}
    for name in profile.pools:
        models.setdefault(profile.serves(name), []).append(name)
    reached: dict[str, ModelReached] = {}
    failures: list[str] = []
    for model, pools in models.items():
        path, body = request_for(profile, pools[0], prompt="Which pool am I on?", max_tokens=4)
        row = reached[model] = ModelReached(path=path, pools=pools)
        try:
            response = requests.post(
                f"{router_url}{path}", json=body, headers={"Authorization": f"Bearer {api_key}"}, timeout=timeout_s
            )
        except requests.RequestException as exc:
            row.error = f"{type(exc).__name__}: {exc}"
            failures.append(f"{model}: {path} through the router failed: {row.error}")
            continue
        row.status = response.status_code
        row.pool = response.headers.get(HEADER_POOL)
        if response.status_code != 200:
            failures.append(
                f"{model}: {path} through the router answered {response.status_code}: {response.text[:200]}"
            )
        elif row.pool not in pools:
            failures.append(
                f"{model}: answered by pool {row.pool!r}, which does not serve it (served by: {', '.join(pools)})"
            )
    return ModelsVerdict(models=reached, failures=failures, passed=not failures)
