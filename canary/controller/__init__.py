"""The imperative shell: reconciling, scheduling, leader election, health and metrics endpoints."""
