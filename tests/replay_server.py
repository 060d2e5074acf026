"""A stand-in SGLang server that replays one sample of tests/fixtures/sglang/: it prints the
sample's log lines as the server's output, then answers /health, and serves the sample's body
on the route it came from (`/server_info` or `/get_server_info`, `/metrics`), or its error
body with its status; every other route is FastAPI's 404. Standard library only, so that
dozens start in a moment.

    python tests/replay_server.py --port 30000 --samples LIST --index N

LIST holds one expected-file path per line (relative to the corpus); the supervisor's command
template passes `{gpu}` as N, so one run replays a sample per server."""

from __future__ import annotations

import argparse
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "fixtures" / "sglang"
NOT_FOUND = (404, "application/json", b'{"detail":"Not Found"}')
Answer = tuple[int, str, bytes]


def routes(expected: dict) -> dict[str, Answer]:
    """What each route answers for this sample (a route not here: 404)."""
    sample = (CORPUS / expected["sample"]).read_bytes()
    kind = expected["kind"]
    out: dict[str, Answer] = {"/health": (200, "text/plain", b"")}
    if kind == "metrics":
        out["/metrics"] = (200, "text/plain; version=0.0.4; charset=utf-8", sample)
    elif kind == "server_info":
        out[expected["endpoint"]] = (200, "application/json", sample)
    elif kind == "error_body":
        status = expected["http_status"]
        for path in ("/server_info", "/get_server_info"):
            out[path] = (status, "application/json", sample)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--samples", type=Path, required=True)
    p.add_argument("--index", type=int, required=True)
    args = p.parse_args(argv)
    names = args.samples.read_text().split()
    expected = json.loads((CORPUS / names[args.index]).read_text())
    if expected["kind"] in ("log", "startup"):
        sys.stdout.buffer.write((CORPUS / expected["sample"]).read_bytes())
        sys.stdout.buffer.flush()
    table = routes(expected)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, ctype, body = table.get(self.path.split("?")[0], NOT_FOUND)
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, format: str, *args: object) -> None:
            pass  # the log is the sample's, nothing else

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
