"""Audio-driven lipsync export: networks.lipsync as ONNX, verified."""
