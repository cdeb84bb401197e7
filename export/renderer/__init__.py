"""2D face renderer export: networks.face2d as ONNX with a dynamic batch, verified."""
