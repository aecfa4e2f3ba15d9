"""Typed records shared by the core: pins, experiments, test results, env info."""
