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


@pytest.fixture
def stops_its_controllers(world: World) -> Iterator[None]:
    """Kills, after the test, the controllers it started and left running — also when it fails: a
    survivor of a failed test would go on governing the module's namespace and show up in the next
    test as a writer it did not start."""
    started = len(world.stack.controllers)
    yield
    for controller in world.stack.controllers[started:]:
        controller.kill()
