"""The product's pod-name patterns against the sandbox's independent port of Knative and the apiserver.

Issue #33, item 1: InferenceService names of 31 characters or more made every pod-joined check read
no data, because pods were found by ``<revision>-deployment-.*`` and ``(.+)-deployment-.+``. The
cluster names a revision's pods ``(ChildName(revision, "-deployment") + "-" + hash + "-")[:58]`` and
5 random characters (knative.dev/pkg kmeta/names.go lines 39-64; kubernetes
pkg/controller/deployment/sync.go and controller_utils.go getPodsPrefix; k8s.io/apiserver
pkg/storage/names/generate.go lines 44-54); tests/sandbox/test_k8s_names.py checks that port
against the upstream test tables.
"""

from __future__ import annotations

import random
import re

import pytest
from canary_sandbox.k8s_names import ALPHANUMS, deployment_name, pod_name, replica_set_name, revision_name

from canary.metrics import podnames
from canary.metrics.podnames import CUT_REVISION, HASHED_KEY, KEPT_REVISION, PodNaming

ISVC = "llama-3-1-70b-instruct-awq-chatbot-prod-eu-west1-canary2"  # ISVC[:31]: the issue's name
LENGTHS = [1, 5, 19, 20, 25, 29, 30, 31, 32, 35, 36, 37, 38, 47, 48, 52, 53]  # 53: the longest possible


def cluster_pods(revision: str, count: int = 40) -> list[str]:
    """Pods as the cluster names them, with pod-template hashes of every possible length."""
    rng = random.Random(revision)
    pods = []
    for index in range(count):
        template_hash = "".join(rng.choice("456789bcdf") for _ in range(1 + index % 10))
        pods.append(pod_name(replica_set_name(deployment_name(revision), template_hash), rng))
    return pods


def revisions_of(length: int) -> list[str]:
    return [revision_name(f"{ISVC[:length]}-predictor", generation) for generation in (1, 2, 12)]


@pytest.mark.parametrize("length", LENGTHS)
def test_a_revisions_pattern_matches_all_its_pods_and_no_other_revisions(length: int) -> None:
    revisions = revisions_of(length) + revisions_of(length - 1 if length > 1 else 2)
    for revision in revisions:
        assert podnames.deployment_name(revision) == deployment_name(revision)
        pattern = re.compile(podnames.pod_pattern(revision))
        for other in revisions:
            matched = [bool(pattern.fullmatch(pod)) for pod in cluster_pods(other)]
            assert all(matched) if other == revision else not any(matched), (revision, other)


@pytest.mark.parametrize("length", LENGTHS)
def test_the_revision_is_read_back_from_each_of_its_pods(length: int) -> None:
    for revision in revisions_of(length):
        shape = podnames.naming(revision)
        for pod in cluster_pods(revision):
            if shape is PodNaming.HASHED:
                key = re.fullmatch(HASHED_KEY, pod)
                assert key is not None and key.group(1) == podnames.hashed_key(revision)
                continue
            read = re.fullmatch(KEPT_REVISION if shape is PodNaming.KEPT else CUT_REVISION, pod)
            assert read is not None and read.group(1) == revision, (pod, shape)


def test_the_shapes_change_at_31_and_37_characters() -> None:
    shapes = {length: podnames.naming(revisions_of(length)[0]) for length in LENGTHS}
    assert {length for length, shape in shapes.items() if shape is PodNaming.KEPT} == set(LENGTHS[:7])
    assert shapes[30] is PodNaming.KEPT and shapes[31] is PodNaming.CUT and shapes[36] is PodNaming.CUT
    assert shapes[37] is PodNaming.HASHED and shapes[53] is PodNaming.HASHED


def test_the_readers_never_take_one_shapes_pods_for_anothers() -> None:
    for length in LENGTHS:
        for revision in revisions_of(length):
            shape = podnames.naming(revision)
            for pod in cluster_pods(revision):
                # A kept revision's pods never look cut or hashed; a cut one's never look kept.
                if shape is PodNaming.KEPT:
                    assert not re.fullmatch(CUT_REVISION, pod) and not re.fullmatch(HASHED_KEY, pod)
                if shape is PodNaming.CUT:
                    assert not re.fullmatch(KEPT_REVISION, pod) and not re.fullmatch(HASHED_KEY, pod)


def test_one_pattern_for_many_revisions_groups_them_by_shape() -> None:
    revisions = [rev for length in LENGTHS for rev in revisions_of(length)]
    pattern = re.compile(podnames.pods_pattern(revisions))
    assert all(pattern.fullmatch(pod) for revision in revisions for pod in cluster_pods(revision, 10))
    assert not pattern.fullmatch(cluster_pods("another-predictor-00001", 1)[0])
    kept = podnames.pods_pattern(["a-predictor-00001", "b-predictor-00002"])
    assert kept == "(?:a-predictor-00001|b-predictor-00002)-deployment-[a-z0-9]{1,10}-[a-z0-9]{5}"


def test_the_issues_pod_is_found() -> None:
    revision = "llama-3-1-70b-instruct-awq-chat-predictor-00001"
    pod = "llama-3-1-70b-instruct-awq-chat-predictor-00001-deploymentx2k9p"
    assert re.fullmatch(podnames.pod_pattern(revision), pod)
    assert not re.fullmatch(f"{revision}-deployment-.*", pod)  # the pattern the product used before
    match = re.fullmatch(CUT_REVISION, pod)
    assert match is not None and match.group(1) == revision
    assert set(pod[-5:]) <= set(ALPHANUMS)


def test_names_are_escaped_for_re2() -> None:
    assert podnames.pod_pattern("r.1") == r"r\.1-deployment-[a-z0-9]{1,10}-[a-z0-9]{5}"
    assert re.fullmatch(podnames.pod_pattern("r.1"), "r.1-deployment-7d9f8-x2k9p")
    assert not re.fullmatch(podnames.pod_pattern("r.1"), "rx1-deployment-7d9f8-x2k9p")
