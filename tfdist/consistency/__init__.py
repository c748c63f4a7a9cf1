"""tfdist.consistency."""
