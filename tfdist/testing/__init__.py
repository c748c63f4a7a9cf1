"""tfdist.testing."""
