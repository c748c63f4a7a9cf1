"""tfdist: distributed TensorFlow/Keras 3 training for unequal workers."""

from setuptools import find_packages, setup

setup(
    name="tfdist",
    version="0.1.0",
    description=(
        "Parameter-server, SyncReplicas, SSP/DTSSP strategies, straggler "
        "detection, queue input pipelines and a federated simulator for Keras 3."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["tfdist", "tfdist.*"]),
    python_requires=">=3.10",
    install_requires=[
        "tensorflow>=2.21,<2.22",
        "keras>=3.15,<3.16",
        "tensorflow-datasets>=4.9",
        # keras.callbacks.TensorBoard needs it; TensorFlow 2.21 no longer installs it.
        "tensorboard>=2.21,<2.22",
        "numpy>=1.26",
        "grpcio>=1.60",
        "absl-py>=2.0",
        "pyyaml>=6.0",
        # Offline fallback dataset (bundled handwritten digits) for examples.
        "scikit-learn>=1.4",
        # tensorflow-datasets imports it when downloading but does not declare it.
        "importlib_resources>=6.0",
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "pytest-xdist>=3.5",  # scripts/test.sh runs the whole suite on 3 worker processes (README "Tests")
            "hypothesis>=6.100",
            "nbclient>=0.10",
            "nbformat>=5.10",
            "ipykernel>=6.29",
            "matplotlib>=3.8",
            "tf-keras>=2.21,<2.22",  # the test that tf-keras models are refused
            "setproctitle>=1.3",  # forked tasks (TFDIST_FAST_START) show their own command line in ps
        ],
        "bench": ["tf-keras>=2.21,<2.22", "psutil>=5.9", "flwr[simulation]>=1.20"],
    },
    entry_points={
        "console_scripts": [
            "tfdist-launch=tfdist.launch:main",
        ]
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "License :: OSI Approved :: Apache Software License",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
