"""The emulator names revisions and pods as Knative and the apiserver do (issue #33, item 1).

The naming itself is checked against the upstream tests in tests/sandbox/test_k8s_names.py; here the
emulator's pods must follow it: kmeta.ChildName (knative.dev/pkg kmeta/names.go lines 39-64) for the
revision and its Deployment, ``<deployment>-<pod-template-hash>`` for the ReplicaSet (kubernetes
pkg/controller/deployment/sync.go), and ``generateName: <replicaset>-`` cut to 58 characters plus 5
random ones (k8s.io/apiserver pkg/storage/names/generate.go lines 44-54).
"""

from __future__ import annotations

import re

import pytest
from canary_sandbox.emulator import Emulator
from canary_sandbox.emulator import resources as r

from tests.sandbox.emulator.support import NAMESPACE, isvc_manifest

RANDOM = "[bcdfghjklmnpqrstvwxz2456789]{5}"  # rand.go alphanums
TEMPLATE_HASH = "[4-9bcdf]{1,10}"  # SafeEncodeString of a uint32's decimal digits


def named(length: int) -> str:
    name = "llama-3-1-70b-instruct-awq-chatbot-prod-eu-west1-canary2"[:length]
    assert len(name) == length and name[-1] != "-"
    return name


def first_pods(emulator: Emulator, name: str) -> tuple[str, list[str]]:
    emulator.create(isvc_manifest(name=name))
    emulator.advance(1.5)
    (revision,) = emulator.revisions(NAMESPACE, name)
    return revision["name"], revision["pods"]


@pytest.mark.parametrize(
    ("length", "pattern"),
    [
        (5, f"REV-deployment-{TEMPLATE_HASH}-{RANDOM}"),  # "llama": everything fits
        (30, f"REV-deployment-{RANDOM}"),  # the base is cut right after the dash
        (31, f"REV-deployment{RANDOM}"),  # the dash after "deployment" is gone
        (36, f"REV-deplo{RANDOM}"),  # the cut reaches into "deployment"
        (37, f"REV20[0-9a-f]{{32}}-deplo{RANDOM}"),  # the Deployment name is md5-shortened
    ],
)
def test_pods_are_named_as_knative_and_the_apiserver_name_them(
    emulator: Emulator, length: int, pattern: str
) -> None:
    name = named(length)
    revision, pods = first_pods(emulator, name)
    assert revision == f"{name}-predictor-00001"
    expected = pattern.replace("REV20", re.escape(revision[:20])).replace("REV", re.escape(revision))
    assert pods and all(re.fullmatch(expected, pod) for pod in pods), (expected, pods)
    for pod in pods:
        labels = emulator.get(r.PODS, NAMESPACE, pod)["metadata"]["labels"]
        assert labels["serving.knative.dev/revision"] == revision
        assert len(pod) <= 63


def test_the_longest_inference_service_knative_accepts_has_a_hashed_revision_name(emulator: Emulator) -> None:
    name = named(53)  # "<name>-predictor" is 63 characters, the most a DNS-1035 label holds
    revision, pods = first_pods(emulator, name)
    assert re.fullmatch(rf"{re.escape(name[:25])}[0-9a-f]{{32}}-00001", revision)
    assert pods and all(
        re.fullmatch(rf"{re.escape(revision[:20])}[0-9a-f]{{32}}-deplo{RANDOM}", p) for p in pods
    )


def test_a_knative_service_name_over_63_characters_is_refused(emulator: Emulator) -> None:
    name = named(54)
    emulator.create(isvc_manifest(name=name))
    emulator.advance(1.5)
    assert emulator.revisions(NAMESPACE, name) == []
    events = emulator.list_objects(r.EVENTS, NAMESPACE)
    assert any("must be no more than 63 characters" in event["message"] for event in events)
