"""TensorRT: one engine built and verified (engine), every stage + production repository (build)."""
