"""Silero VAD export: the streaming VAD graph with batched state, verified."""
