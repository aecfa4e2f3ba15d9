"""``python -m kvprobe``."""

from kvprobe.cli import main

main()
