"""Verification of an untrusted bundle as numbered steps, and packing a verified bundle."""
