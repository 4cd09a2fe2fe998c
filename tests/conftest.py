"""Test-session set-up shared by every test module."""

import os

# No GPU on dev/CI machines: Triton kernels run under its interpreter.  Must be set before
# anything imports triton (it decorates its own library functions at import time).
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
