"""Worker (no TensorFlow) for tests/test_launchers.py: prints this process' HOROVOD_* variables
as one line, "HOROVOD_VARIABLES {json}", as a launcher gave them."""
import json
import os

print("HOROVOD_VARIABLES " + json.dumps(
    {k: v for k, v in sorted(os.environ.items()) if k.startswith("HOROVOD_")}), flush=True)
