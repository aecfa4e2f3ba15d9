"""kvprobe: reproduce an upstream security fix as a pinned, checkable evidence bundle."""

__version__ = "0.1.0"
