"""Model training, kept apart from export: the lipsync network and the emotion classifier."""
