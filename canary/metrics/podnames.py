"""Which pods are a Knative revision's: exact pod-name patterns, computed as the cluster names pods.

Why pod names, and not the ``serving.knative.dev/revision`` label
-----------------------------------------------------------------
Every pod-joined check (OOM kills, restarts, warm-up from kube-state-metrics, GPU memory from
dcgm-exporter, vLLM's engine metrics, and queue-proxy's OpenTelemetry request metrics) gets series
that name the pod, and none that name the revision, on a default installation:

* kube-state-metrics exports pod labels only as ``kube_pod_labels{label_serving_knative_dev_revision}``
  and only when started with ``--metric-labels-allowlist=pods=[serving.knative.dev/revision]``; every
  check would then need a ``* on (namespace, pod) group_left (...) kube_pod_labels`` join, and a
  cluster without the flag would read no data at all;
* dcgm-exporter's pod mapping gives ``pod``/``namespace`` (or ``pod_name``/``pod_namespace``), not
  the pod's labels; vLLM's and queue-proxy's series get a revision label only from a scrape
  relabelling the operator writes (``metrics.revisionLabel`` already uses one where it exists).

The pod name, on the other hand, is fully determined by the revision name, except for two parts we
can bound exactly. So the product computes it instead of guessing from ``<revision>-deployment-...``:

1. Knative names the revision's Deployment ``kmeta.ChildName(revision, "-deployment")``
   (knative.dev/pkg ``kmeta/names.go`` lines 39-64): as is up to 63 characters, else the revision's
   first 20 characters, the md5 of the revision in hex, and ``-deployment``;
2. the Deployment controller names the ReplicaSet ``<deployment>-<pod-template-hash>`` (kubernetes
   ``pkg/controller/deployment/sync.go``), the hash being 1 to 10 characters (the decimal digits of
   a uint32 through ``rand.SafeEncodeString``, ``pkg/controller/controller_utils.go`` ComputeHash);
3. the ReplicaSet controller creates pods with ``generateName: <replicaset>-`` (``getPodsPrefix``),
   and the apiserver cuts that base to 58 characters and appends 5 random characters
   (k8s.io/apiserver ``pkg/storage/names/generate.go`` lines 44-54).

A pod of the revision therefore matches ``^<(deployment + "-")[:58]><rest of the cut base><5>$``
exactly, where the rest is the hash and its dash, cut where the 58 end. From a 31-character
InferenceService the dash after ``deployment`` is cut away; from 37 characters the Deployment name is
hashed and the revision's name is no longer in its pods' names at all.

Reading the revision back from a pod name (:func:`naming`): *kept* revisions (their pods start with
``<revision>-deployment-``) and *cut* ones (``<revision>-deplo...`` and 5 characters) are read by
one pattern each, exactly; a *hashed* revision is recognised by its pods' first 52 characters
(:func:`hashed_key`), which the queries map back to the revision's name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from enum import StrEnum

from canary.metrics.promql import regex_literal

__all__ = [
    "CUT_REVISION",
    "HASHED_KEY",
    "KEPT_REVISION",
    "PodNaming",
    "deployment_name",
    "hashed_key",
    "naming",
    "pod_pattern",
    "pods_pattern",
]

_LONGEST = 63  # kmeta/names.go: longest; also the apiserver's maxNameLength
_HEAD = 31  # kmeta/names.go: longest - md5Len
_GENERATED_BASE = 58  # generate.go: MaxGeneratedNameLength = maxNameLength - randomLength
_SUFFIX = "-deployment"
_HASH_CHARS = 10  # the decimal digits of a uint32
_CHAR = "[a-z0-9]"
_RANDOM = f"{_CHAR}{{5}}"

# The revision, read back from the pod name of a kept or a cut revision (fully anchored, as PromQL is).
KEPT_REVISION = f"(.+)-deployment-{_CHAR}*-?{_RANDOM}"
CUT_REVISION = f"(.+)-deplo(?:y(?:m(?:e(?:n(?:t)?)?)?)?)?{_RANDOM}"
# The first 52 characters of a hashed revision's pods: its first 20 and the md5 of its name.
HASHED_KEY = f"(.{{20}}[0-9a-f]{{32}})-deplo{_RANDOM}"


class PodNaming(StrEnum):
    """How much of the revision's name its pods' names keep."""

    KEPT = "kept"  # <revision>-deployment-[<hash>-]xxxxx, the hash possibly cut
    CUT = "cut"  # <revision>-deplo[yment]xxxxx: the generated base was cut inside "-deployment"
    HASHED = "hashed"  # <revision[:20]><md5>-deploxxxxx: the Deployment name is md5-shortened


def deployment_name(revision: str) -> str:
    """``kmeta.ChildName(revision, "-deployment")`` (names.go line 41 the test, 61 the shortening)."""
    if len(revision) <= _LONGEST - len(_SUFFIX):
        return revision + _SUFFIX
    digest = hashlib.md5(revision.encode(), usedforsecurity=False).hexdigest()
    return revision[: _HEAD - len(_SUFFIX)] + digest + _SUFFIX


def naming(revision: str) -> PodNaming:
    if len(revision) > _LONGEST - len(_SUFFIX):
        return PodNaming.HASHED
    return PodNaming.KEPT if len(revision) + len(_SUFFIX) < _GENERATED_BASE else PodNaming.CUT


def hashed_key(revision: str) -> str:
    """What :data:`HASHED_KEY` reads from the pods of a hashed revision."""
    return deployment_name(revision)[: _HEAD - len(_SUFFIX) + 32]


def _parts(revision: str) -> tuple[str, str]:
    """The literal start of the revision's pod names and the pattern of the rest."""
    base = (deployment_name(revision) + "-")[:_GENERATED_BASE]
    room = _GENERATED_BASE - len(base)  # what is left of the 58 for "<hash>-"
    if room == 0:
        rest = ""
    elif room == 1:
        rest = _CHAR  # the hash's first character
    elif room <= _HASH_CHARS:
        rest = f"(?:{_CHAR}{{1,{room - 1}}}-|{_CHAR}{{{room}}})"  # all of it and its dash, or cut
    else:
        rest = f"{_CHAR}{{1,{_HASH_CHARS}}}-"
    return base, rest + _RANDOM


def pod_pattern(revision: str) -> str:
    """An RE2 pattern matching exactly the names of the revision's pods (anchor it, or let PromQL)."""
    base, rest = _parts(revision)
    return regex_literal(base) + rest


def pods_pattern(revisions: Iterable[str]) -> str:
    """One RE2 pattern for the pods of all ``revisions``, grouped by the shape of the rest, sorted
    so that the query text is stable."""
    groups: dict[tuple[str, str], set[str]] = {}
    for revision in revisions:
        base, rest = _parts(revision)
        literal = "-deployment-" if base.endswith("-deployment-") else ""
        groups.setdefault((literal, rest), set()).add(base.removesuffix(literal))
    alternatives = [
        "(?:"
        + "|".join(regex_literal(start) for start in sorted(starts))
        + ")"
        + regex_literal(literal)
        + rest
        for (literal, rest), starts in sorted(groups.items())
    ]
    if len(alternatives) == 1:
        return alternatives[0]
    return "(?:" + "|".join(alternatives) + ")"
