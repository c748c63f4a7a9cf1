"""Entry point: ``python -m tfdist.launch`` (see :mod:`tfdist.cluster.launch`)."""

import sys

from tfdist.cluster.launch import main

if __name__ == "__main__":
    sys.exit(main())
