"""What a simulated answer reports about its request: the native `meta_info`, the OpenAI
`usage`, finish fields and `metadata`, and the speculative-decoding details, keyed and typed
as a real SGLang 0.5.23 answers (tests/fixtures/sglang/real-0.5.23/bodies/)."""

from __future__ import annotations

import time
from typing import Any

from agents.sim.model import SimModel, SimRequest
from agents.sim.output import EOS_TOKEN_ID
from agents.sim.settings import SimSettings

WEIGHT_VERSION = "default"


class MetaInfo:
    """The per-request figures of one model's answers."""

    def __init__(self, model: SimModel, settings: SimSettings) -> None:
        self.model = model
        self.s = settings

    def _wall(self, t: float) -> float:
        """A model-clock instant as a Unix time, as SGLang's `*_ts` and `*_time` keys."""
        return time.time() - (self.model.clock() - t)

    def spec(self, req: SimRequest) -> dict[str, Any]:
        n, verify = req.generated, req.verify_ct
        steps = self.model.cfg.spec_num_steps
        correct = max(0, n - verify)
        return {"spec_verify_ct": verify,
                "spec_accept_length": n / verify if verify else 0.0,
                "spec_accept_rate": correct / (verify * steps) if verify else 0.0,
                "spec_num_correct_drafts": correct,
                "spec_num_proposed_drafts": verify * steps}

    def finish_dict(self, req: SimRequest) -> dict[str, Any] | None:
        if req.finish == "stop":
            return {"type": "stop", "matched": EOS_TOKEN_ID}
        if req.finish == "length":
            return {"type": "length", "length": req.generated}
        if req.finish == "abort":
            return {"type": "abort", "message": req.abort_message,
                    "status_code": req.abort_status, "err_type": None}
        return None

    def weight_versions(self, req: SimRequest) -> list[dict[str, Any]]:
        return [{"version": WEIGHT_VERSION, "start": 0, "end": req.generated}]

    def metadata(self, req: SimRequest) -> dict[str, Any]:
        return {"weight_version": WEIGHT_VERSION, "weight_versions": self.weight_versions(req)}

    def meta(self, req: SimRequest, streamed: int | None = None,
             first: bool = False) -> dict[str, Any]:
        """`meta_info`, in SGLang's key order; the timing keys only with --enable-metrics
        (decode_throughput once more than one token is out, as SGLang's own). A stream's
        chunk before the last (`streamed` tokens out) has no finish, and neither the
        weight versions nor the latencies, but for its first chunk's send time."""
        now = self.model.clock()
        end = req.finished_at if req.finished_at is not None else now
        timed = self.s.enable_metrics
        n = req.generated if streamed is None else streamed
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": self.finish_dict(req) if streamed is None else None,
            "prompt_tokens": req.prompt_tokens, "weight_version": WEIGHT_VERSION,
            "num_retractions": req.retractions}
        if timed and req.admitted is not None:
            token = req.first_token_at if req.first_token_at is not None else now
            meta.update(storage_prefetch_wait=0.0, storage_staging_wait=0.0,
                        forward_entry_time=self._wall(req.admitted),
                        prefill_finished_time=self._wall(token),
                        queue_time=req.admitted - req.created)
        meta.update({"reasoning_tokens": self.reasoning_tokens(req, n), "completion_tokens": n,
                     "cached_tokens": req.cached_tokens})
        if streamed is None:
            meta["weight_versions"] = self.weight_versions(req)
        meta.update({"cached_tokens_details": ({"device": req.cached_tokens, "host": 0}
                                               if req.cached_tokens else None),
                     "dp_rank": req.dp_rank if len(self.model.ranks) > 1 else None})
        if streamed is not None:
            if timed and first:
                meta["response_sent_to_client_ts"] = self._wall(now)
            return meta
        meta["e2e_latency"] = end - req.created
        if timed:
            meta["request_received_ts"] = self._wall(req.created)
            if req.first_token_at is not None:
                meta["first_token_latency"] = req.first_token_at - req.created
            meta["api_server_dispatch_finish_ts"] = self._wall(req.created)
            if req.finished_at is not None:
                meta["request_finished_ts"] = self._wall(req.finished_at)
                if req.first_token_at is not None and n > 1 and end > req.first_token_at:
                    meta["decode_throughput"] = (n - 1) / (end - req.first_token_at)
                meta["response_sent_to_client_ts"] = self._wall(req.finished_at)
        if self.model.cfg.spec:
            meta.update(self.spec(req))
        return meta

    def reasoning_tokens(self, req: SimRequest, n: int) -> int:
        """Counted by the reasoning parser: none without one (0.5.23 says 0)."""
        return req.plan.reasoning_tokens_at(n) if self.s.reasoning_parser else 0

    def usage(self, req: SimRequest) -> dict[str, Any]:
        n = req.generated
        reasoning = self.reasoning_tokens(req, n)
        return {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens + n,
                "completion_tokens": n,
                "prompt_tokens_details": ({"cached_tokens": req.cached_tokens}
                                          if self.s.enable_cache_report else None),
                "reasoning_tokens": reasoning,
                "completion_tokens_details": ({"reasoning_tokens": reasoning}
                                              if reasoning > 0 else None)}

    def openai_finish(self, req: SimRequest) -> tuple[str, int | None]:
        if req.finish == "stop":
            tool = req.plan.tool_name is not None and req.generated >= req.plan.n_tokens
            return ("tool_calls" if tool else "stop"), EOS_TOKEN_ID
        return str(req.finish), None

    def tool_calls(self, req: SimRequest) -> list[dict[str, Any]]:
        return [{"id": f"call_{req.rid[:24]}", "index": 0, "type": "function",
                 "function": {"name": req.plan.tool_name,
                              "arguments": req.plan.tool_arguments}}]
