"""`kvprobe gates`: a deployment's logs, arguments and code against the four acceptance gates."""
