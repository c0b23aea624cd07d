"""Who the CLI is, as the API server sees it: the ``by`` of an operator command.

``POST /apis/authentication.k8s.io/v1/selfsubjectreviews`` (``kubectl auth whoami``; GA in
Kubernetes 1.28, where every authenticated user may call it through ``system:basic-user``) answers
with the username the apiserver authenticated — the same ``request.userInfo.username`` the
admission policy compares the command's issuer with. Never an environment variable: a name anyone
can set is not an identity.

An API server that does not offer it (older than 1.28, or the review forbidden) leaves only the
kubeconfig's user entry name, which nothing verifies: :class:`Identity` says so in ``note``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

__all__ = ["Identity", "who_am_i"]

# Not offered (404: < 1.28 without the beta API; 405) or not allowed (403: system:basic-user removed).
_NOT_OFFERED = (403, 404, 405)


@dataclass(frozen=True, slots=True)
class Identity:
    username: str
    verified: bool  # the API server's own answer
    note: str | None = None  # why it is not verified, for the person


def who_am_i(api_client: client.ApiClient, kubeconfig: str | None, *, timeout: float = 10.0) -> Identity:
    """The username the API server authenticates ``api_client`` as; raises ApiException for other
    failures (an unreachable or failing apiserver is not a reason to guess)."""
    try:
        review = client.AuthenticationV1Api(api_client).create_self_subject_review(
            client.V1SelfSubjectReview(), _request_timeout=timeout
        )
    except ApiException as error:
        if error.status not in _NOT_OFFERED:
            raise
        name = _kubeconfig_user(kubeconfig) or "unknown"
        return Identity(
            name,
            verified=False,
            note=(
                f"the API server answered {error.status} to a SelfSubjectReview (Kubernetes < 1.28?): "
                f"the command names the kubeconfig's user entry {name!r} as its issuer, which nothing "
                "verified"
            ),
        )
    status = review.status
    user = status.user_info if status is not None else None
    username = user.username if user is not None else None
    if not username:
        name = _kubeconfig_user(kubeconfig) or "unknown"
        return Identity(
            name,
            verified=False,
            note=f"the SelfSubjectReview named no user: {name!r} is unverified",
        )
    return Identity(username, verified=True)


def _kubeconfig_user(kubeconfig: str | None) -> str | None:
    try:
        _, active = config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError, TypeError, KeyError):
        return None
    context = (active or {}).get("context") or {}
    user = context.get("user")
    return str(user) if user else None
