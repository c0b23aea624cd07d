"""core/v1 Secrets as the apiserver serves them: ``stringData`` is write-only and folded into ``data``
(base64), ``data`` must be base64, keys are config keys, ``type`` defaults to Opaque and is immutable."""

from __future__ import annotations

import base64

import pytest
from kubernetes import client


def secret(name: str, **fields: object) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, **fields}


def test_string_data_is_folded_into_data_and_never_shown(core: client.CoreV1Api) -> None:
    core.create_namespaced_secret("default", secret("folded", data={"A": "eA=="}, stringData={"B": "hook"}))
    stored = core.read_namespaced_secret("folded", "default")
    assert stored.data == {"A": "eA==", "B": base64.b64encode(b"hook").decode()}
    assert stored.string_data is None
    assert stored.type == "Opaque"


def test_string_data_overrides_the_same_key_in_data(core: client.CoreV1Api) -> None:
    core.create_namespaced_secret("default", secret("override", data={"A": "eA=="}, stringData={"A": "y"}))
    assert core.read_namespaced_secret("override", "default").data == {"A": "eQ=="}


def test_data_that_is_not_base64_is_refused(core: client.CoreV1Api) -> None:
    with pytest.raises(client.ApiException) as refused:
        core.create_namespaced_secret("default", secret("bad", data={"A": "not base64!"}))
    assert refused.value.status == 400
    assert "illegal base64 data" in str(refused.value.body)


def test_a_key_that_is_not_a_config_key_is_invalid(core: client.CoreV1Api) -> None:
    with pytest.raises(client.ApiException) as refused:
        core.create_namespaced_secret("default", secret("badkey", stringData={"a/b": "x"}))
    assert refused.value.status == 422
    assert "data[a/b]" in str(refused.value.body)


def test_the_type_cannot_change(core: client.CoreV1Api) -> None:
    core.create_namespaced_secret("default", secret("typed", stringData={"A": "x"}))
    current = core.read_namespaced_secret("typed", "default")
    current.type = "kubernetes.io/basic-auth"
    with pytest.raises(client.ApiException) as refused:
        core.replace_namespaced_secret("typed", "default", current)
    assert refused.value.status == 422
    assert "field is immutable" in str(refused.value.body)
