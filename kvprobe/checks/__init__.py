"""The checks that run on a side: upstream pytest files and kvprobe probes, and their results."""
