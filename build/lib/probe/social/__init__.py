"""Social-preference benchmark: social evaluation data sets turned into preferences between responses."""
