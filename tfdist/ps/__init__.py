"""tfdist.ps."""
