"""Numbers out of range in run.toml (and the fleet file's node numbers): each row runs the real
`fleetdeck-agent generate` (or `fleetdeck status`) on one, and expects exit 2 with a message
naming the file and the key, no traceback, and nothing written anywhere: the spec is refused
at load, before any run directory exists. `health_interval_s = 0` and `base_port = 70000` were
accepted before (issue 11, item 12); TOML's nan and inf too.

Boundary rows show the check is a range, not a ban: the value loads, and the run is refused
only later, for its empty prompts file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile.conftest import assert_only_changed, assert_refused, run_cli, tree

SERVERS_URLS = 'urls = ["http://127.0.0.1:9"]'


def spec_text(servers: str = "", generate: str = "", extra: str = "",
              urls: str = SERVERS_URLS) -> str:
    return "\n".join(["[run]", 'name = "ranges"', 'dir = "run"', "", "[servers]", urls, servers,
                      "", "[generate]", 'prompts = "prompts.jsonl"', generate, "", extra, ""])


GPUS = 'gpus = [0, 1]\ncommand = "serve {model} --port {port}"\nmodel = "m"'

BAD = [
    pytest.param(spec_text(servers="base_port = 70000"), "[servers] base_port", "65535",
                 id="base-port-70000"),
    pytest.param(spec_text(servers="base_port = 0"), "[servers] base_port", "between 1",
                 id="base-port-0"),
    pytest.param(spec_text(servers="base_port = -1"), "[servers] base_port", "between 1",
                 id="base-port-negative"),
    pytest.param(spec_text(servers="base_port = 65535\n" + GPUS, urls=""),
                 "[servers] base_port", "past port 65535", id="base-port-runs-past-65535"),
    pytest.param(spec_text(servers="gpus = [0, -1]\ncommand = \"x {model} {port}\"", urls=""),
                 "[servers] gpus[1]", "negative", id="gpu-negative"),
    pytest.param(spec_text(urls='urls = ["http://127.0.0.1:70000"]'), "[servers] urls[0]",
                 "out of range", id="url-port-70000"),
    pytest.param(spec_text(servers="health_interval_s = 0"), "[servers] health_interval_s",
                 "more than 0", id="health-interval-0"),
    pytest.param(spec_text(servers="health_timeout_s = -1.5"), "[servers] health_timeout_s",
                 "more than 0", id="health-timeout-negative"),
    pytest.param(spec_text(servers="startup_timeout_s = nan"), "[servers] startup_timeout_s",
                 "finite", id="startup-timeout-nan"),
    pytest.param(spec_text(servers="hung_restart_s = inf"), "[servers] hung_restart_s",
                 "finite", id="hung-restart-inf"),
    pytest.param(spec_text(servers="max_restarts = -1"), "[servers] max_restarts",
                 "negative", id="max-restarts-negative"),
    pytest.param(spec_text(servers="restart_backoff_s = -5.0"), "[servers] restart_backoff_s",
                 "negative", id="restart-backoff-negative"),
    pytest.param(spec_text(servers="health_failures_to_down = 0"),
                 "[servers] health_failures_to_down", "at least 1", id="failures-to-down-0"),
    pytest.param(spec_text(generate="request_timeout_s = 0"), "[generate] request_timeout_s",
                 "positive", id="request-timeout-0"),
    pytest.param(spec_text(generate="connect_timeout_s = -inf"),
                 "[generate] connect_timeout_s", "finite", id="connect-timeout-minus-inf"),
    pytest.param(spec_text(generate="drain_timeout_s = 0"), "[generate] drain_timeout_s",
                 "more than 0", id="drain-timeout-0"),
    pytest.param(spec_text(generate="max_prompt_bytes = 0"), "[generate] max_prompt_bytes",
                 "at least 1", id="max-prompt-bytes-0"),
    pytest.param(spec_text(generate="batch_size = -3"), "[generate] batch_size",
                 "at least 1", id="batch-size-negative"),
    pytest.param(spec_text(extra="[alerts]\nwindow_s = 0"), "[alerts] window_s",
                 "more than 0", id="alerts-window-0"),
    pytest.param(spec_text(extra="[alerts]\nfailure_rate = 1.5"), "[alerts] failure_rate",
                 "between 0 and 1", id="alerts-rate-over-1"),
    pytest.param(spec_text(generate="request_timeout_s = 20\nmin_deadline_s = 50"),
                 "[generate] min_deadline_s", "at most request_timeout_s (20), got 50",
                 id="min-deadline-written-over-request-timeout"),
    pytest.param(spec_text(generate="max_concurrency = 16\nconcurrency_per_server = 64"),
                 "[generate] concurrency_per_server", "above max_concurrency 16",
                 id="concurrency-written-over-max-concurrency"),
    pytest.param(spec_text(extra="[alerts]\nmin_samples = -1"), "[alerts] min_samples",
                 "negative", id="alerts-min-samples-negative"),
    pytest.param(spec_text(extra="[alerts]\ndisk_hours = nan"), "[alerts] disk_hours",
                 "finite", id="alerts-disk-hours-nan"),
    pytest.param(spec_text(extra='[alerts]\nwebhook = "hooks.example/SEKRIT-77"'),
                 "[alerts] webhook", "http:// or https://", id="alerts-webhook-no-scheme"),
    pytest.param(spec_text(extra="[alerts]\nwebhook_per_minute = 0"),
                 "[alerts] webhook_per_minute", "1..600", id="alerts-webhook-per-minute-0"),
    pytest.param(spec_text(extra="[alerts]\nwebhook_queue = 0"),
                 "[alerts] webhook_queue", "1..100000", id="alerts-webhook-queue-0"),
    pytest.param(spec_text(extra='[alerts]\nwebhook_format = "pagerduty"'),
                 "[alerts] webhook_format", "enum", id="alerts-webhook-format-unknown"),
    pytest.param(spec_text(extra='[alerts]\nprometheus_textfile = "fleetdeck.prom"'),
                 "[alerts] prometheus_textfile", "absolute", id="alerts-textfile-relative"),
    pytest.param(spec_text(extra='[alerts]\nprometheus_textfile = "/tmp/fleetdeck.txt"'),
                 "[alerts] prometheus_textfile", "*.prom", id="alerts-textfile-not-prom"),
    pytest.param(spec_text(extra='[alerts]\nprometheus_textfile = "/no/such/d/f.prom"'),
                 "[alerts] prometheus_textfile", "no such folder", id="alerts-textfile-no-dir"),
]


def _setup(tmp_path: Path, text: str) -> Path:
    (tmp_path / "prompts.jsonl").write_text("")
    spec = tmp_path / "run.toml"
    spec.write_text(text)
    return spec


@pytest.mark.parametrize(("text", "key", "why"), BAD)
def test_a_number_out_of_range_is_refused_at_load(tmp_path: Path, home: Path, text: str,
                                                  key: str, why: str) -> None:
    spec = _setup(tmp_path, text)
    before = tree(tmp_path)
    out = run_cli("fleetdeck-agent", "generate", spec, env={"HOME": str(home)})
    assert_refused(out, 2, [str(spec), key, why])
    assert_only_changed(before, tree(tmp_path))
    assert not (tmp_path / "run").exists()
    assert "SEKRIT" not in out.stdout + out.stderr  # a webhook URL is a secret


BOUNDARY = [
    pytest.param(spec_text(servers="base_port = 65535"), id="base-port-65535"),
    pytest.param(spec_text(servers="base_port = 1\nhealth_interval_s = 0.001"),
                 id="base-port-1-tiny-interval"),
    pytest.param(spec_text(servers="max_restarts = 0\nrestart_backoff_s = 0"),
                 id="no-restarts-no-backoff"),
    pytest.param(spec_text(extra="[alerts]\nfailure_rate = 0\naccept_drop = 1"),
                 id="alert-shares-at-0-and-1"),
    # Defaults that follow another key (issue 20 item 6): refused before, for keys never written.
    pytest.param(spec_text(generate="request_timeout_s = 20"), id="request-timeout-20-alone"),
    pytest.param(spec_text(generate="max_concurrency = 16"), id="max-concurrency-16-alone"),
    pytest.param(spec_text(generate="request_timeout_s = 20\ndeadline_factor = 0\n"
                           "min_deadline_s = 50"), id="min-deadline-unread-with-deadlines-off"),
]


GROUPS_LOAD = [
    pytest.param('gpus = [[0, 1], [2, 3]]', id="gpus-two-groups-of-two"),
    pytest.param('gpus = [[3, 1], [0]]', id="gpus-groups-of-unequal-size-any-order"),
    pytest.param('gpus = [[0]]', id="gpus-one-group-of-one"),
]


@pytest.mark.parametrize("gpus", GROUPS_LOAD)
def test_gpu_groups_load(tmp_path: Path, home: Path, gpus: str) -> None:
    text = spec_text(servers=gpus + '\ncommand = "serve {model} --port {port} --tp {tp} '
                     '--gpus {gpus} --first {gpu}"\nmodel = "m"', urls="")
    spec = _setup(tmp_path, text)
    out = run_cli("fleetdeck-agent", "generate", spec, env={"HOME": str(home)})
    # Loaded: `generate` alone refuses only because gpus servers need the supervisor.
    assert_refused(out, 2, ["[servers] has gpus, not urls", str(spec)])
    assert "gpus[" not in out.text


@pytest.mark.parametrize("text", BOUNDARY)
def test_a_number_at_the_edge_of_its_range_loads(tmp_path: Path, home: Path,
                                                 text: str) -> None:
    spec = _setup(tmp_path, text)
    out = run_cli("fleetdeck-agent", "generate", spec, env={"HOME": str(home)})
    # Loaded: refused only for the empty prompts file, after the spec checks.
    assert_refused(out, 2, ["prompts file is empty", str(tmp_path / "prompts.jsonl")])
    assert "must be" not in out.text


def fleet_text(node: str, pulls: Path) -> str:
    return "\n".join(["[console]", f'pull_dir = "{pulls}"', "", "[[nodes]]", 'name = "gen-1"',
                      'host = "127.0.0.1"', 'run_dir = "/data/run"', node, ""])


FLEET_BAD = [
    pytest.param("port = 70000", "port", "between 1 and 65535", id="fleet-port-70000"),
    pytest.param("port = 0", "port", "between 1 and 65535", id="fleet-port-0"),
    pytest.param("connect_timeout_s = 0", "connect_timeout_s", "above 0",
                 id="fleet-connect-timeout-0"),
    pytest.param("keepalive_s = nan", "keepalive_s", "above 0", id="fleet-keepalive-nan"),
    pytest.param("pull_stall_s = -1", "pull_stall_s", "above 0", id="fleet-pull-stall-negative"),
    pytest.param("pull_stall_s = inf", "pull_stall_s", "above 0", id="fleet-pull-stall-inf"),
]


@pytest.mark.parametrize(("node", "key", "why"), FLEET_BAD)
def test_a_fleet_node_number_out_of_range_is_refused(tmp_path: Path, home: Path, node: str,
                                                     key: str, why: str) -> None:
    fleet = tmp_path / "fleet.toml"
    pulls = tmp_path / "pulls"
    fleet.write_text(fleet_text(node, pulls))
    before = tree(tmp_path)
    out = run_cli("fleetdeck", "--fleet", fleet, "status", env={"HOME": str(home)})
    assert_refused(out, 2, [str(fleet), "nodes[0]", key, why])
    assert_only_changed(before, tree(tmp_path))
    assert_only_changed({}, tree(home / ".ssh"))


EFFECTIVE = [
    pytest.param("request_timeout_s = 20", 40, 20.0, id="floor-follows-request-timeout"),
    pytest.param("request_timeout_s = 600", 40, 30.0, id="floor-default-under-a-long-timeout"),
    pytest.param("request_timeout_s = 20\nmin_deadline_s = 5", 40, 5.0, id="floor-written"),
    pytest.param("max_concurrency = 16", 16, 30.0, id="concurrency-follows-max-concurrency"),
    pytest.param("max_concurrency = 100", 40, 30.0, id="concurrency-default-under-a-high-cap"),
    pytest.param('concurrency_per_server = "auto"\nmax_concurrency = 2', 2, 30.0,
                 id="auto-starts-under-a-low-cap"),
]


@pytest.mark.parametrize(("generate", "level", "floor"), EFFECTIVE)
def test_a_default_that_depends_on_another_key_follows_it(tmp_path: Path, generate: str,
                                                          level: int, floor: float) -> None:
    """What the engine is given (its first level, its deadline floor) for a spec that leaves
    the dependent key unset: the default under the other key, never a refusal."""
    from agents.rundir.spec import load_spec

    spec = _setup(tmp_path, spec_text(generate=generate))
    gen = load_spec(spec).generate
    assert gen is not None
    assert (gen.initial_concurrency, gen.deadline_floor_s) == (level, floor)
