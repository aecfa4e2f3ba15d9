"""The pipeline for one experiment (materialize -> env -> checks -> receipt -> bundle) and its re-run."""
