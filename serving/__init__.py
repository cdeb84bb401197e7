"""Serving: the embedded tritonserver launcher (`server`), its supervisor, repository
materialisation for a target (`repository`, `deployment`) and the `avatar` command (`cli`).
The app layer: the only package that may import every other (export to build artifacts,
the gateway, clients)."""
