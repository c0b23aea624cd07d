"""The sandbox's port of Knative's and the apiserver's naming, against the upstream tests and code.

Upstream sources (stored copies read through the code search):

* knative.dev/pkg ``kmeta/names.go`` (vendored in knative/serving at 057104fe): ``ChildName``, lines
  39-64 (line 41 the length test, 61 the md5 shortening, 44-59 the long-suffix branch); its test
  table ``kmeta/names_test.go`` at 4fd6eb86 (``TestChildName``) is reproduced below;
* knative/serving ``pkg/reconciler/revision/resources/names/names_test.go`` at 2ebc8fcf
  (``TestNamer``: "Deployment too long" / "Deployment long enough");
* k8s.io/apiserver ``pkg/storage/names/generate.go``: ``maxNameLength = 63``, ``randomLength = 5``,
  ``MaxGeneratedNameLength = 58`` (lines 44-46), the cut and the random suffix (lines 49-54);
* k8s.io/apimachinery ``pkg/util/rand/rand.go``: ``alphanums`` and ``SafeEncodeString``;
* kubernetes ``pkg/controller/deployment/sync.go`` (``getNewReplicaSet``: ``d.Name + "-" +
  podTemplateSpecHash``) and ``pkg/controller/controller_utils.go`` (``getPodsPrefix``: ``<rs>-``;
  ``ComputeHash``: ``SafeEncodeString(fmt.Sprint(hasher.Sum32()))``).
"""

from __future__ import annotations

import random
import re

import pytest
from canary_sandbox.k8s_names import (
    ALPHANUMS,
    MAX_GENERATED_NAME_LENGTH,
    child_name,
    deployment_name,
    generate_name,
    pod_name,
    pod_template_hash,
    replica_set_name,
    revision_name,
    safe_encode_string,
)

# knative.dev/pkg kmeta/names_test.go at 4fd6eb86, TestChildName, in order.
CHILD_NAME_CASES = [
    ("asdf", "-deployment", "asdf-deployment"),
    ("f" * 63, "-deployment", "ffffffffffffffffffff105d7597f637e83cc711605ac3ea4957-deployment"),
    ("f" * 63, "-deploy", "ffffffffffffffffffffffff105d7597f637e83cc711605ac3ea4957-deploy"),
    ("f" * 63, "f" * 63, "fffffffffffffffffffffffffffffff0502661254f13c89973cb3a83e0cbec0"),
    ("a", "f" * 63, "ab5cfd486935decbc0d305799f4ce4414ffffffffffffffffffffffffffffff"),
    ("b" * 32, "f" * 32, "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb329c7c81b9ab3ba71aa139066aa5625d"),
    ("aaaa", "b---a" * 20, "aaaa7a3f7966594e3f0849720eced8212c18b---ab---ab---ab---ab---ab"),
    ("a" * 17, "a.-.-.-.-.-.-.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "aaaaaaaaaaaaaaaaaa1eb10dc911444f8434af83b7225442da"),
]  # fmt: skip


@pytest.mark.parametrize(("parent", "suffix", "want"), CHILD_NAME_CASES)
def test_child_name_reproduces_knatives_own_test_table(parent: str, suffix: str, want: str) -> None:
    assert child_name(parent, suffix) == want


def test_deployment_names_as_knatives_namer_test() -> None:
    # knative/serving names_test.go at 2ebc8fcf: 52 + len("-deployment") = 63 fits, 63 is hashed.
    assert deployment_name("f" * 52) == "f" * 52 + "-deployment"
    assert deployment_name("f" * 63) == "ffffffffffffffffffff105d7597f637e83cc711605ac3ea4957-deployment"
    assert deployment_name("foo") == "foo-deployment"


def test_generate_name_cuts_the_base_to_58_and_adds_5_of_rands_characters() -> None:
    # generate.go lines 50-53: base[:MaxGeneratedNameLength] + utilrand.String(randomLength).
    assert MAX_GENERATED_NAME_LENGTH == 58
    name = generate_name("x" * 70, random.Random(1))
    assert len(name) == 63
    assert name[:58] == "x" * 58
    assert set(name[58:]) <= set(ALPHANUMS)
    short = generate_name("abc-", random.Random(1))
    assert short.startswith("abc-") and len(short) == 9


def test_the_pod_template_hash_is_the_safe_encoded_decimal_of_a_uint32() -> None:
    # SafeEncodeString maps the digits '0'..'9' (48..57) to alphanums[21..26, 0..3]: "456789bcdf".
    assert safe_encode_string("0123456789") == "456789bcdf"
    for seed in ("a", "uid/llama-predictor-00001", "x" * 100):
        assert re.fullmatch(r"[4-9bcdf]{1,10}", pod_template_hash(seed))


def isvc_pod(isvc: str, seed: int = 3) -> tuple[str, str, str]:
    """(revision, deployment, pod) of an InferenceService's first revision, named as upstream does."""
    revision = revision_name(f"{isvc}-predictor", 1)
    deployment = deployment_name(revision)
    owner = replica_set_name(deployment, "7d9f8c6b5")
    return revision, deployment, pod_name(owner, random.Random(seed))


def named(length: int) -> str:
    """An InferenceService name of ``length`` characters (31: the issue's ``...-awq-chat``)."""
    name = "llama-3-1-70b-instruct-awq-chatbot-prod-eu-west1-canary2"[:length]
    assert len(name) == length and name[-1] != "-"
    return name


def test_a_30_character_inference_service_keeps_deployment_and_its_dash() -> None:
    revision, deployment, pod = isvc_pod(named(30))
    assert (len(revision), len(deployment)) == (46, 57)
    # generateName "<deployment>-7d9f8c6b5-" is 68 characters: cut to 58, the hash is gone.
    assert re.fullmatch(rf"{deployment}-[{ALPHANUMS}]{{5}}", pod)


def test_a_31_character_inference_service_loses_the_dash_after_deployment() -> None:
    revision, deployment, pod = isvc_pod(named(31))
    assert revision == "llama-3-1-70b-instruct-awq-chat-predictor-00001"
    assert deployment == f"{revision}-deployment" and len(deployment) == 58
    assert re.fullmatch(rf"llama-3-1-70b-instruct-awq-chat-predictor-00001-deployment[{ALPHANUMS}]{{5}}", pod)
    assert f"{revision}-deployment-" not in pod


def test_a_36_character_inference_service_cuts_into_deployment() -> None:
    revision, deployment, pod = isvc_pod(named(36))
    assert (len(revision), deployment) == (52, f"{revision}-deployment")  # 63: not hashed yet
    assert re.fullmatch(rf"{revision}-deplo[{ALPHANUMS}]{{5}}", pod)


def test_from_37_characters_the_deployment_name_is_md5_shortened() -> None:
    revision, deployment, pod = isvc_pod(named(37))
    assert len(revision) == 53
    # kmeta/names.go line 61: parent[:head-len(suffix)] = 20 characters, then md5(parent) in hex.
    assert re.fullmatch(rf"{revision[:20]}[0-9a-f]{{32}}-deployment", deployment)
    assert deployment == child_name(revision, "-deployment")
    assert re.fullmatch(rf"{revision[:20]}[0-9a-f]{{32}}-deplo[{ALPHANUMS}]{{5}}", pod)
    assert revision not in pod


def test_the_longest_name_knative_accepts_hashes_the_revision_name_too() -> None:
    # The Knative Service "<isvc>-predictor" must be a DNS-1035 label (63): 53 characters at most.
    isvc = named(53)
    revision, deployment, pod = isvc_pod(isvc)
    assert len(f"{isvc}-predictor") == 63
    assert re.fullmatch(rf"{isvc[:25]}[0-9a-f]{{32}}-00001", revision)
    assert len(deployment) == 63 and deployment.endswith("-deployment")
    assert len(pod) == 63 and pod.startswith(deployment[:58])
