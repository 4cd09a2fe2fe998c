"""Type promotion in the kernels' lowering (fxforge/codegen/ir/aten.py): ``promoted_dtypes``,
worked out once per signature, answers what torch's ``elementwise_dtypes`` answers for the
arguments themselves, for every promotion kind, under any default dtype."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as K, elementwise_dtypes

from fxforge.codegen.ir.aten import promoted_dtypes

DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128)
KINDS = tuple(K)

tensors = st.builds(lambda dt, shape: torch.zeros(shape, dtype=dt), st.sampled_from(DTYPES),
                    st.sampled_from(((), (1,), (2, 3))))
numbers = st.one_of(st.booleans(), st.integers(-5, 5), st.floats(-2.0, 2.0, allow_nan=False),
                    st.complex_numbers(max_magnitude=2.0))


def _answer(f):
    try:
        return f()
    except Exception as e:  # (a combination torch refuses is refused alike)
        return type(e)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(tensors, numbers), min_size=1, max_size=3), st.sampled_from(KINDS),
       st.sampled_from((torch.float32, torch.float64)))
def test_promoted_dtypes_are_torchs(args, kind, default):
    old = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        assert _answer(lambda: promoted_dtypes(args, kind)) == _answer(
            lambda: elementwise_dtypes(*args, type_promotion_kind=kind))
    finally:
        torch.set_default_dtype(old)


def test_a_symbolic_number_is_asked_as_it_is():
    import sympy

    x = sympy.Symbol("x", integer=True)
    assert promoted_dtypes([torch.zeros(2, dtype=torch.float16), x], K.DEFAULT) == \
        elementwise_dtypes(torch.zeros(2, dtype=torch.float16), x, type_promotion_kind=K.DEFAULT)


@pytest.mark.parametrize("zero_dim", [True, False])
def test_a_tensor_with_no_dimension_promotes_as_eager_says(zero_dim):
    # (the case the signature must tell apart: a 0-dim float64 tensor does not lift float32)
    t = torch.zeros((), dtype=torch.float64) if zero_dim else torch.zeros(2, dtype=torch.float64)
    want = torch.float32 if zero_dim else torch.float64
    assert promoted_dtypes([torch.zeros(3), t], K.DEFAULT)[1] == want
