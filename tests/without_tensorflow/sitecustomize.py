"""Makes `import tensorflow` (and tensorflow-text) fail, as on a machine
without them: on PYTHONPATH, Python runs this at start-up in every process."""

import sys


class _WithoutTensorFlow:
    blocked = ("tensorflow", "tensorflow_text", "tensorflow_datasets", "tf_keras")

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _WithoutTensorFlow())
