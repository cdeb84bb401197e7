"""The live gateway: the web page and one WebSocket endpoint bridged to Triton over gRPC
(`vad` for endpointing, `avatar` for turns). It holds no model. docs/protocol.md."""
