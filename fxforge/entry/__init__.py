"""Entry points: how users reach fxforge (``torch.compile``'s backend, exported programs,
``fxforge.partition``, the command line and its demo)."""
