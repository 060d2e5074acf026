"""The tier's own ground: the environment it built is the one the lock names, and the server it
starts is SGLang 0.5.23 serving the tiny model, with the counters the other tests read."""

from __future__ import annotations

import httpx

from tests.real.env import SGLANG_VERSION, RealEnv
from tests.real.server import RealServer


def test_the_shared_server_is_sglang_of_the_lock_serving_the_tiny_model(
        real_env: RealEnv, server: RealServer) -> None:
    info = server.server_info()
    assert info["version"] == SGLANG_VERSION
    assert info["model_path"] == str(real_env.model)
    assert info["max_total_num_tokens"] == 65536
    before = server.metrics()
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "model": "tiny", "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 16})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    after = server.metrics()
    assert after.delta(before, "generation_tokens_total") == usage["completion_tokens"]
    assert after.delta(before, "prompt_tokens_total") == usage["prompt_tokens"]
    assert after.delta(before, "num_requests_total") == 1
