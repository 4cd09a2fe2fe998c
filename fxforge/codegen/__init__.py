"""Codegen: the backend registry, the built-in backends, and the generated wrapper."""
