"""Torch modules shared by export, training and clients: the 2D face and the lipsync network."""
