"""tfdist.cluster."""
