"""Property testing for graph passes: draw ATen FX graphs, check a pass keeps their meaning.

    from fxforge.testing import graphs, check_pass

    @given(graphs())
    def test_my_pass(example):
        gm, inputs = example
        check_pass(my_pass, gm, inputs)

Importing this module registers two hypothesis profiles: "ci" (200 examples per property) and
"thorough" (10,000). FXFORGE_HYPOTHESIS_PROFILE picks one (default "ci"); without the variable a
profile the caller already loaded is left alone. `profile()` returns the selected one, for tests
whose budget must not depend on what else is loaded.
"""
import os

from hypothesis import HealthCheck, settings

from .copies import CopyCounter
from .equivalence import Check, PassCheckFailure, TOLERANCES, check_pass, random_inputs, random_tensor
from .strategies import (ALL_DTYPES, FAMILIES, FLOATS, INTS, OPS, GraphBuilder, Op, binary, dtypes, graphs,
                         op_nodes, select_ops, shapes, unary)

# Building a graph under a FakeTensorMode takes milliseconds per node: timing health checks and
# per-example deadlines would only measure that. Explicit values throughout, because a
# registered profile otherwise inherits whatever profile is loaded at registration time
# (hypothesis itself loads its own "ci", derandomized with 100 examples, when $CI is set).
_COMMON = dict(deadline=None, derandomize=False, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=200, **_COMMON)
settings.register_profile("thorough", max_examples=10_000, **_COMMON)


def profile() -> settings:
    """The profile FXFORGE_HYPOTHESIS_PROFILE names ("ci" by default), whichever one is loaded:
    tests that must run with fxforge's budget use `@settings(profile())` or
    `settings(profile(), max_examples=...)` rather than relying on the loaded default."""
    return settings.get_profile(os.environ.get("FXFORGE_HYPOTHESIS_PROFILE", "ci"))


def _load_profile():
    # an explicit FXFORGE_HYPOTHESIS_PROFILE wins; otherwise replace hypothesis' own defaults
    # ("default", or "ci", whose registration ours just replaced) but keep a user's profile
    current = getattr(settings, "get_current_profile_name", lambda: "default")()
    if "FXFORGE_HYPOTHESIS_PROFILE" in os.environ or current in ("default", "ci"):
        settings.load_profile(os.environ.get("FXFORGE_HYPOTHESIS_PROFILE", "ci"))


_load_profile()

__all__ = [
    "ALL_DTYPES", "Check", "CopyCounter", "FAMILIES", "FLOATS", "INTS", "OPS", "GraphBuilder", "Op", "PassCheckFailure",
    "TOLERANCES", "binary", "check_pass", "dtypes", "graphs", "op_nodes", "profile", "random_inputs",
    "random_tensor", "select_ops", "shapes", "unary",
]
