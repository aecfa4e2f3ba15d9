"""experiment.toml: load and validate, scaffold (`kvprobe new`), record expectations."""
