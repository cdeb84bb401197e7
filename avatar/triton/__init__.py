"""Triton adapters: the only package that imports `triton_python_backend_utils`.

Its modules are imported inside the python-backend stub; everything they call lives in
the Triton-free parts of `avatar`.
"""
