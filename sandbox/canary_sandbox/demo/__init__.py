"""``kserve-canary demo``: three models, one story, on the sandbox's emulator, fleet and Prometheus."""
