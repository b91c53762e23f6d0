"""Makes TensorFlow (and tensorflow-text) absent, as on a machine without
them: on PYTHONPATH, Python runs this at start-up in every process.

A None in `sys.modules` is Python's own mark of a module that cannot be
imported: `import tensorflow` raises ModuleNotFoundError, and
`importlib.util.find_spec("tensorflow")` answers None, as when it is not
installed.
"""

import sys

for name in ("tensorflow", "tensorflow_text", "tensorflow_datasets", "tf_keras"):
    sys.modules[name] = None
