"""Piper VITS export: graph rewrite, verified recipe, FP16/INT8 variants, quality report."""
