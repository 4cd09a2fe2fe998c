"""C codegen backend: fused C kernels for CPU graphs, one shared object per wrapper (see docs/c.md)."""
