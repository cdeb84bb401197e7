"""Serving: the embedded tritonserver launcher (`server`), its supervisor, repository
materialisation for a target (`repository`, `deployment`) and the `avatar` command (`cli`).
The only part of `avatar` that may import the export tooling (to build artifacts)."""
