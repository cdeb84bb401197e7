"""Whisper speech recognition, Triton-free: log-mel features, prompts and vocabulary, greedy
decoding with Whisper's timestamp rules over an abstract encoder/decoder, segmentation."""
