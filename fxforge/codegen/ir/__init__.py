"""The kernel IR shared by every kernel language: values and their vocabulary (``values.py``),
what ATen's operators compute in it (``aten.py``), and the printers' common ground
(``printer.py``).  A language's package (``codegen/c``, ``codegen/triton``) renders it."""
