"""Passes over the ATen graph: backend assignment, fusion, scheduling, memory planning."""
