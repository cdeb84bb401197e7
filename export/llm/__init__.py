"""LLM decoder export: checkpoint conversion, ONNX step, verification, report, TensorRT profile."""
