"""tfdist.strategies."""
