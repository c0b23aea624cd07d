"""``kserve-canary dashboard``: a local web UI over every rollout, acting with the user's kubeconfig.

:mod:`canary.dashboard.server` serves it (and guards it: docs/dashboard.md, "Security"),
:mod:`canary.dashboard.views` builds what its JSON API says, :mod:`canary.dashboard.actions` writes
operator commands the way ``kserve-canary pause`` does. The page is ``static/`` (no build step,
nothing fetched from anywhere else).
"""
