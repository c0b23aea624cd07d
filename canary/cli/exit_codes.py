"""The documented exit codes of ``kserve-canary`` (a leaf: the help and the failure texts both use them)."""

EXIT_OK = 0
EXIT_REFUSED = 1  # refused (by the CLI or the controller) or invalid (a policy, a stored document)
EXIT_USAGE = 2  # the command line itself: click's own code for usage errors
EXIT_UNREACHABLE = 3  # the cluster or Prometheus could not be reached (or no kubeconfig to reach it)
# status NAME --watch: how the rollout it followed ended (0 promoted, or nothing to roll out).
EXIT_ROLLED_BACK = 4  # rolled back (by a check, a gate, a deadline or abort)
EXIT_PAUSED = 5  # paused: it waits for a person (pause, approval, a horizon, an external change)
EXIT_STALLED = 6  # still under way when --timeout ran out
