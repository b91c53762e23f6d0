"""Model sizes of Table 3 of the paper, as `Transformer` arguments."""

PRESETS = {
    # Table 3, row "base": 65M parameters with the shared 37k vocabulary.
    "base": {
        "vocabulary_size": 37000,
        "num_layers": 6,
        "d_model": 512,
        "d_ff": 2048,
        "num_heads": 8,
        "dropout": 0.1,
    },
    # Table 3, row "big": 213M parameters; P_drop=0.3 for English-German.
    "big": {
        "vocabulary_size": 37000,
        "num_layers": 6,
        "d_model": 1024,
        "d_ff": 4096,
        "num_heads": 16,
        "dropout": 0.3,
    },
    # Not in the paper: the size of Tensor2Tensor's `transformer_small`,
    # for small corpora and CPU experiments.
    "small": {
        "vocabulary_size": 8000,
        "num_layers": 2,
        "d_model": 256,
        "d_ff": 1024,
        "num_heads": 4,
        "dropout": 0.1,
    },
    # Not in the paper: small enough to train in seconds on a CPU, for tests
    # and the quick start.
    "tiny": {
        "vocabulary_size": 1000,
        "num_layers": 2,
        "d_model": 64,
        "d_ff": 256,
        "num_heads": 4,
        "dropout": 0.1,
    },
}
