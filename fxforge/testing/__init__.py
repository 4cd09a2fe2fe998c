"""Property testing for graph passes: draw ATen FX graphs, check a pass keeps their meaning.

    from fxforge.testing import graphs, check_pass

    @given(graphs())
    def test_my_pass(example):
        gm, inputs = example
        check_pass(my_pass, gm, inputs)

Importing this module registers two hypothesis profiles: "ci" (200 examples per property) and
"thorough" (10,000). FXFORGE_HYPOTHESIS_PROFILE picks one (default "ci"); without the variable a
profile the caller already loaded is left alone.
"""
import os

from hypothesis import HealthCheck, settings

from .equivalence import Check, PassCheckFailure, TOLERANCES, check_pass, random_inputs, random_tensor
from .strategies import (ALL_DTYPES, FAMILIES, FLOATS, INTS, OPS, GraphBuilder, Op, binary, dtypes, graphs,
                         op_nodes, select_ops, shapes, unary)

# Building a graph under a FakeTensorMode takes milliseconds per node: timing health checks and
# per-example deadlines would only measure that.
_SLOW_OK = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=200, **_SLOW_OK)
settings.register_profile("thorough", max_examples=10_000, **_SLOW_OK)


def _load_profile():
    # an explicit FXFORGE_HYPOTHESIS_PROFILE wins; otherwise keep a profile the caller loaded
    current = getattr(settings, "get_current_profile_name", lambda: "default")()
    if "FXFORGE_HYPOTHESIS_PROFILE" in os.environ or current == "default":
        settings.load_profile(os.environ.get("FXFORGE_HYPOTHESIS_PROFILE", "ci"))


_load_profile()

__all__ = [
    "ALL_DTYPES", "Check", "FAMILIES", "FLOATS", "INTS", "OPS", "GraphBuilder", "Op", "PassCheckFailure",
    "TOLERANCES", "binary", "check_pass", "dtypes", "graphs", "op_nodes", "random_inputs", "random_tensor",
    "select_ops", "shapes", "unary",
]
