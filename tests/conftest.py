"""Suites are marked by the directory they live in, so ``make test-fast`` skips every slow one.

- ``tests/integration/`` — against a real Prometheus server (Debian's package): ``integration``;
- ``tests/e2e/`` — the controller as a separate process, the emulator and Prometheus: ``e2e``;
- ``tests/faults/`` — the same stack with faults injected (Prometheus, the API, the receiver, kills): ``faults``;
- ``tests/fuzz/`` — thousands of generated policies, states, commands and Prometheus answers: ``fuzz``;
- ``tests/deploy/`` marks its controller-process tests ``e2e`` itself (its conftest knows which).

Everything else mirrors a package (``tests/policy`` for ``canary.policy``, ``tests/sandbox`` for
``canary_sandbox``, ...) and runs in seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
_MARK_BY_DIRECTORY = {
    "integration": pytest.mark.integration,
    "e2e": pytest.mark.e2e,
    "faults": pytest.mark.faults,
    "fuzz": pytest.mark.fuzz,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        try:
            top = item.path.resolve().relative_to(_TESTS).parts[0]
        except ValueError:
            continue
        mark = _MARK_BY_DIRECTORY.get(top)
        if mark is not None:
            item.add_marker(mark)
