"""Photo portrait: MediaPipe landmarks -> rig -> `networks.portrait` as ONNX, verified."""
