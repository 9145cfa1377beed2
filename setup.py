"""tftorus: 2D-torus all-reduce for TensorFlow/Horovod, and the paper's ResNet-50 recipe.

TensorFlow is not a plain dependency: `pip install -e .` into an environment that already has
TensorFlow leaves it as it is and installs neither TensorFlow nor Horovod. The two stacks name
theirs in extras, and `run_scripts/setup.sh` (TFTORUS_STACK=classic|current) installs them:

  classic  `.[cpu]` / `.[gpu]`: TensorFlow 2.15.1 (Keras 2), tensorflow-addons, numpy<2; then
           Horovod 0.28.1, which must be compiled against the TensorFlow already installed, so
           setup.sh builds it after this package.
  current  `.[current-cpu]` / `.[current-gpu]`: TensorFlow 2.21.0 (Keras 3), TensorBoard, no
           Horovod.
"""
from setuptools import find_packages, setup

TF_VERSION = "2.15.1"  # the classic stack
CURRENT_TF_VERSION = "2.21.0"  # the current stack

# what the classic stack adds to the TensorFlow it pins
CLASSIC = [
    "tensorflow-addons==0.23.0",
    "numpy>=1.23,<2",
    "cloudpickle",  # horovodrun needs it
]
# what the current stack adds: TensorFlow no longer brings TensorBoard since 2.20, and the
# trainer writes its scalars with tf.summary; cloudpickle, as Horovod's broadcast_object and
# allgather_object take lambdas and local functions (tftorus/horovod_api/functions.py)
CURRENT = [f"tensorboard~={CURRENT_TF_VERSION.rsplit('.', 1)[0]}.0", "cloudpickle"]

setup(
    name="tftorus",
    version="0.1.0",
    description="2D-torus all-reduce (Mikami et al., 1811.05233) as a drop-in Horovod optimizer",
    python_requires=">=3.9,<3.14",
    packages=find_packages(include=["tftorus*", "official_resnet*", "flags*"]),
    install_requires=[
        "absl-py>=1.0",
        "numpy>=1.23",
        "pillow>=9",  # writes the embedded JPEG data set
        "psutil",
    ],
    extras_require={
        "cpu": [f"tensorflow-cpu=={TF_VERSION}", *CLASSIC],
        "gpu": [f"tensorflow[and-cuda]=={TF_VERSION}", *CLASSIC],
        "current-cpu": [f"tensorflow-cpu=={CURRENT_TF_VERSION}", *CURRENT],
        "current-gpu": [f"tensorflow[and-cuda]=={CURRENT_TF_VERSION}", *CURRENT],
        # matplotlib ships real photos for input tests (and draws the studies' figures); scipy:
        # the cost model's fit (studies). Not scikit-learn: Keras 3 imports it when installed.
        "test": ["pytest", "scipy", "matplotlib"],
    },
)
