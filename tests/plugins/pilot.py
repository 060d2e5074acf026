"""Textual's Pilot, patient on a loaded machine: before each key, pause and start-up it waits
for the screen's queued messages, and raises WaitForScreenTimeout after 30 s (a figure for an
idle machine; a loaded one has spent that on one round). Every test gets two minutes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from textual.pilot import Pilot

PATIENCE_S = 120.0


@pytest.fixture(autouse=True)
def patient_pilot(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    wait = Pilot._wait_for_screen

    async def patient(self: Pilot, timeout: float = PATIENCE_S) -> bool:  # type: ignore[type-arg]
        return await wait(self, max(timeout, PATIENCE_S))

    monkeypatch.setattr(Pilot, "_wait_for_screen", patient)
    yield
