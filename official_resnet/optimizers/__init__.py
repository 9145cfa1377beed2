"""The optimizer: LARS (lars picks the Keras 2 or Keras 3 class; lars_core holds the update
both run) and the paper's LR and momentum schedules. Bottom layer: imports only tftorus."""
from official_resnet.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "LARS": "lars",
    "Schedule": "schedules", "lr_config_a": "schedules", "lr_config_b": "schedules",
    "momentum_for_batch": "schedules",
})
