from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.notify.support import EventApiServer, Receiver


@pytest.fixture
def receiver_factory() -> Iterator[Callable[[], Receiver]]:
    started: list[Receiver] = []

    def start() -> Receiver:
        receiver = Receiver()
        started.append(receiver)
        return receiver

    yield start
    for receiver in started:
        receiver.stop()


@pytest.fixture
def receiver(receiver_factory: Callable[[], Receiver]) -> Receiver:
    return receiver_factory()


@pytest.fixture
def apiserver() -> Iterator[EventApiServer]:
    server = EventApiServer()
    yield server
    server.stop()
