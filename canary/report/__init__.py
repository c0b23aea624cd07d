"""Reports of rollouts: HTML pages with inline SVG charts (:mod:`canary.report.charts`)."""
