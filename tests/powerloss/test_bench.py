"""The overhead benchmark at a smoke size, so that it cannot silently break (its figures are
for the report, not pass/fail)."""

from __future__ import annotations

from tests.powerloss.bench import report, run


def test_bench_smoke() -> None:
    results = run(200)
    assert set(results) == {"forgetfs", "tmpfs", "disk"}
    assert all(v > 0 for r in results.values() for v in r.values())
    assert "forgetfs" in report(results) and "x tmpfs" in report(results)
