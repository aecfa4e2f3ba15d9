"""Dependency locks -> cached virtualenvs, and the cache that holds them (entries, locks, leases, prune)."""
