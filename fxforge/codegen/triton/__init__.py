"""Triton codegen backend: one Triton kernel per group (see docs/triton.md)."""
