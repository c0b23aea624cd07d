"""How Knative and Kubernetes name a revision's objects, ported from their Go sources.

The chain from an InferenceService to its pods, each step as upstream does it:

1. KServe names the Knative Service ``<isvc>-predictor``; Knative's Configuration has the same name.
2. Knative names each revision ``kmeta.ChildName(configuration, fmt.Sprintf("-%05d", generation))``
   (knative/serving ``pkg/reconciler/configuration/resources/revision.go``, ``MakeRevision``).
3. Knative names the revision's Deployment ``kmeta.ChildName(revision, "-deployment")``
   (knative/serving ``pkg/reconciler/revision/resources/names/names.go``; ``names_test.go`` at
   2ebc8fcf: 52 characters + ``-deployment`` stay as they are, 63 are hashed).
4. The Deployment controller names its ReplicaSet ``d.Name + "-" + podTemplateSpecHash`` (kubernetes
   ``pkg/controller/deployment/sync.go``, ``getNewReplicaSet``), the hash being
   ``rand.SafeEncodeString(fmt.Sprint(fnv32a(template)))`` (``pkg/controller/controller_utils.go``,
   ``ComputeHash``): the decimal digits of a uint32 mapped through rand's alphabet, 1 to 10 characters.
5. The ReplicaSet controller creates pods with ``generateName: <replicaset>-``
   (``controller_utils.go``, ``getPodsPrefix``), and the apiserver's ``SimpleNameGenerator`` cuts that
   base to 58 characters and appends 5 random ones (k8s.io/apiserver ``pkg/storage/names/generate.go``
   lines 44-54; the characters from ``k8s.io/apimachinery/pkg/util/rand/rand.go``'s ``alphanums``).

So a pod is ``<revision>-deployment-<hash>-xxxxx`` only while that fits; a 31-character
InferenceService gives ``...-predictor-00001-deploymentx2k9p`` and from 37 characters the Deployment
name itself is an md5-shortened one. This module is the sandbox's own port, kept apart from the
product's (``canary.podnames``) so that each checks the other.
"""

from __future__ import annotations

import hashlib
import random

__all__ = [
    "ALPHANUMS",
    "MAX_GENERATED_NAME_LENGTH",
    "child_name",
    "deployment_name",
    "generate_name",
    "pod_name",
    "pod_template_hash",
    "replica_set_name",
    "revision_name",
    "revision_pod_name",
    "safe_encode_string",
]

# knative.dev/pkg kmeta/names.go (as vendored in knative/serving at 057104fe), lines 27-31.
_LONGEST = 63
_MD5_LEN = 32
_HEAD = _LONGEST - _MD5_LEN
# k8s.io/apiserver pkg/storage/names/generate.go, lines 42-47.
_MAX_NAME_LENGTH = 63
_RANDOM_LENGTH = 5
MAX_GENERATED_NAME_LENGTH = _MAX_NAME_LENGTH - _RANDOM_LENGTH
# k8s.io/apimachinery pkg/util/rand/rand.go: "We omit vowels ... to reduce the chances of bad words".
ALPHANUMS = "bcdfghjklmnpqrstvwxz2456789"


def child_name(parent: str, suffix: str) -> str:
    """``kmeta.ChildName`` (kmeta/names.go lines 39-64), line by line."""
    name = parent
    if len(parent) > _LONGEST - len(suffix):  # line 41
        if _HEAD - len(suffix) <= 0:  # line 44: the suffix itself is too long
            digest = hashlib.md5((parent + suffix).encode(), usedforsecurity=False).hexdigest()
            if len(parent) > _HEAD:  # lines 47-49
                parent = parent[:_HEAD]
            ret = parent + digest  # line 53
            if (room := _LONGEST - len(ret)) > 0:  # lines 54-56
                ret += suffix[:room]
            return _valid_end(ret)  # line 59
        digest = hashlib.md5(parent.encode(), usedforsecurity=False).hexdigest()
        name = parent[: _HEAD - len(suffix)] + digest  # line 61
    return name + suffix  # line 63


def _valid_end(name: str) -> str:
    """The end of the long-suffix branch. The vendored names.go (057104fe, line 59) trims trailing
    dashes; knative/pkg's ``names_test.go`` at 4fd6eb86 (its last case, ``a.-.-.-...``) expects every
    trailing non-alphanumeric character gone, as the current ``makeValidName`` does. Both agree on
    dashes; this follows the newer one. Suffixes as short as ``-deployment`` never get here."""
    while name and not name[-1].isalnum():
        name = name[:-1]
    return name


def revision_name(configuration: str, generation: int) -> str:
    """Knative's ``MakeRevision``: ``kmeta.ChildName(config.Name, fmt.Sprintf("-%05d", generation))``."""
    return child_name(configuration, f"-{generation:05d}")


def deployment_name(revision: str) -> str:
    """knative/serving ``names.Deployment``: ``kmeta.ChildName(rev.Name, "-deployment")``."""
    return child_name(revision, "-deployment")


def safe_encode_string(value: str) -> str:
    """``rand.SafeEncodeString``: every character mapped to ``alphanums[int(b) % len(alphanums)]``."""
    return "".join(ALPHANUMS[ord(char) % len(ALPHANUMS)] for char in value)


def pod_template_hash(template: str) -> str:
    """``ComputeHash``'s shape: SafeEncodeString of the decimal FNV-1a 32-bit hash (of ``template``
    here, of the DeepHashObject of the pod template there)."""
    digest = 0x811C9DC5
    for byte in template.encode():
        digest = ((digest ^ byte) * 0x01000193) & 0xFFFFFFFF
    return safe_encode_string(str(digest))


def replica_set_name(deployment: str, template_hash: str) -> str:
    """sync.go ``getNewReplicaSet``: ``d.Name + "-" + podTemplateSpecHash``."""
    return f"{deployment}-{template_hash}"


def generate_name(base: str, rng: random.Random) -> str:
    """``SimpleNameGenerator.GenerateName`` (generate.go lines 49-54): base cut to 58, 5 random chars."""
    if len(base) > MAX_GENERATED_NAME_LENGTH:
        base = base[:MAX_GENERATED_NAME_LENGTH]
    return base + "".join(rng.choice(ALPHANUMS) for _ in range(_RANDOM_LENGTH))


def pod_name(owner: str, rng: random.Random) -> str:
    """A pod of the ReplicaSet ``owner``: ``getPodsPrefix`` gives ``owner + "-"`` (a DNS subdomain up
    to 253 characters keeps the dash), and the apiserver generates the name from it."""
    return generate_name(f"{owner}-", rng)


def revision_pod_name(revision: str, index: int = 0) -> str:
    """The ``index``-th pod of a Knative revision, reproducibly: its Deployment's ReplicaSet (the hash
    seeded by the revision), the generated name seeded by ``revision/index``."""
    owner = replica_set_name(deployment_name(revision), pod_template_hash(revision))
    return pod_name(owner, random.Random(f"{revision}/{index}"))  # noqa: S311 (names, not secrets)
