"""tfdist.datasets: the bundled digits, offline."""


def test_digits_are_read_from_scikit_learns_file_without_importing_it():
    """tfdist.datasets.load_digits reads the bundled csv itself (a second less per process), same arrays."""
    import subprocess
    import sys

    import numpy as np
    from sklearn.datasets import load_digits as sklearn_digits

    from tfdist.datasets import _digits_arrays, load_digits

    images, target = _digits_arrays()
    reference = sklearn_digits()
    np.testing.assert_array_equal(images, reference.images)
    np.testing.assert_array_equal(target, reference.target)
    data = load_digits()
    assert data.x_train.shape == (1438, 8, 8, 1) and data.x_test.shape == (359, 8, 8, 1)
    code = "import sys; from tfdist.datasets import load_digits; load_digits(); print('sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
