"""Verification of an untrusted bundle as numbered steps, and bundle archives (pack/extract)."""
