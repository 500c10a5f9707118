"""Statistics over saved results (run directories and human-rating tables). Nothing here loads a model."""
