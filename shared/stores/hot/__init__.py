"""The hot tier: per-type Redis lists the dispensers pop from and keysync fills, and
keysync's wake channel; the scripts in ``lua/``."""
