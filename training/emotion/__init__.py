"""Sentence emotion classifier training and evaluation."""
