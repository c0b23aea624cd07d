"""Fixtures of the fault suite: each module starts one stack (``WORLD``: its namespace and models)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.support import World, running_world


@pytest.fixture(scope="module")
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    module = request.module
    with running_world(
        module.NAMESPACE,
        module.MODELS,
        behaviours=getattr(module, "BEHAVIOURS", None),
        policies=getattr(module, "POLICIES", None),
    ) as started:
        yield started
