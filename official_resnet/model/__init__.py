"""The model: ResNet v1.5 (network), the recipe's train step (recipe_model), BN statistics
recomputed for evaluation, Keras 3's fused BatchNormalization, and what Keras 2 and 3 spell
differently (keras_generation, the one place). Bottom layer: imports only tftorus."""
from official_resnet.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "resnet": "network", "BLOCKS": "network", "BN_EPSILON": "network", "BN_MOMENTUM": "network",
    "RecipeModel": "recipe_model",
    "recompute_bn_statistics": "bn_statistics",
    "KERAS": "keras_generation",
})
