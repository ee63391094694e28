"""Results: records of runs (``records``), their listing and comparability, their tables."""
