"""tftorus: 2D-torus all-reduce for TensorFlow/Horovod, and the paper's ResNet-50 recipe.

Horovod is not a plain dependency: it must be compiled against the TensorFlow already installed,
so `run_scripts/setup.sh` installs this package first and builds Horovod 0.28.1 after it.
"""
from setuptools import find_packages, setup

TF_VERSION = "2.15.1"

setup(
    name="tftorus",
    version="0.1.0",
    description="2D-torus all-reduce (Mikami et al., 1811.05233) as a drop-in Horovod optimizer",
    python_requires=">=3.9,<3.12",
    packages=find_packages(include=["tftorus*", "official_resnet*", "flags*"]),
    install_requires=[
        "absl-py>=1.0",
        "numpy>=1.23,<2",
        "tensorflow-addons==0.23.0",
        "pillow>=9",  # writes the embedded JPEG data set
        "cloudpickle",  # horovodrun needs it
        "psutil",
    ],
    extras_require={
        "cpu": [f"tensorflow-cpu=={TF_VERSION}"],
        "gpu": [f"tensorflow[and-cuda]=={TF_VERSION}"],
        # sklearn ships real JPEG photos for input tests; scipy: the cost model's fit (studies)
        "test": ["pytest", "scikit-learn", "scipy", "matplotlib"],
    },
)
