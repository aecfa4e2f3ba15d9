"""experiment.toml and profiles: load, validate, scaffold (`kvprobe new`), record expectations."""
