"""Whisper ASR export: encoder/decoder recipes, weights, test clips, report, TensorRT profile."""
