"""Lipsync training: synthesized speech with phoneme timings, training, held-out evaluation."""
