"""The documented exit codes of ``kserve-canary`` (a leaf: the help and the failure texts both use them)."""

EXIT_OK = 0
EXIT_REFUSED = 1  # refused (by the CLI or the controller) or invalid (a policy, a stored document)
EXIT_USAGE = 2  # the command line itself: click's own code for usage errors
EXIT_UNREACHABLE = 3  # the cluster or Prometheus could not be reached (or no kubeconfig to reach it)
