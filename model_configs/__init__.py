"""The model repository's `config.pbtxt` files read as Triton's `ModelConfig` (tritonclient's
protobuf): a layer under export, serving and perf, above the Triton-free core."""
