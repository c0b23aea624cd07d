"""The CLI tests' cluster fixture (tests.cli.support)."""

from tests.cli.support import cluster

__all__ = ["cluster"]
