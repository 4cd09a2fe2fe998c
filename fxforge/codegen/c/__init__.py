"""C codegen backend: fused C kernels for CPU graphs, built in parallel translation units (see docs/c.md)."""
