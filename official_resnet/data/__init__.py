"""The data: the input pipeline (ImageNet TFRecords to augmented batches), which files and
records each worker reads (sharding), record counts without every worker reading every record
(dataset_info), and the embedded stand-in for ImageNet generated offline. Bottom layer: imports
only tftorus."""
from official_resnet.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "make_dataset": "input_pipeline", "AugmentConfig": "input_pipeline",
    "DataError": "input_pipeline",
    "shard_files": "sharding",
    "DataSizes": "dataset_info",
    "EmbeddedSpec": "embedded_data", "DEFAULT_DATA_DIR": "embedded_data",
})
