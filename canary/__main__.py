"""``python -m canary`` is the ``kserve-canary`` command."""

from canary.cli import main

main()
