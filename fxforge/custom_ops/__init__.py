"""Custom-op tuning: each candidate implementation of a custom op proven against the op, the
ones that agree timed, the fastest inlined.

``register_custom_op_autotuning(op, configs=[CustomOpConfig(impl, **params), ...])`` names
decompositions of ``op``: Python functions of ATen ops computing what the op computes.  When a
graph calling ``op`` compiles (``torch.compile``, ``compile_exported``) with
``Config(custom_op_tuning="on")`` (the default), each call site is tuned at its input shapes:

1. **Correctness first.**  Inputs are generated for the call site (``input_gen_fns``, else
   ``fxforge.testing.random_tensor`` at the site's shapes and dtypes).  Each candidate runs
   eagerly on them and is compared with the op itself (``fxforge.testing.mismatch``:
   dtype-aware tolerances).  Where the op has a gradient (``torch.library.register_autograd``),
   the candidate's gradients are compared with the op's too.  A candidate that raises or
   disagrees is rejected: a WARNING names it, the input and the largest error, and
   ``stats["custom_ops"]`` records it.
2. **Then speed.**  The op itself (``CustomOpConfig()``: the fallback, called opaquely) and each
   accepted candidate are compiled by fxforge with the compile's Config, each at the site
   among the neighbours the backend fuses with it (``context_of``), and timed (calls
   interleaved, the least time over rounds; ``fxforge.infra.timing``).  A candidate is chosen when
   it is ``min_speedup`` times as fast as the op or more; the fastest such one wins.
3. **Inlined.**  The winner replaces the op's node before the graph is lowered (for
   ``torch.compile``, in the graph handed to AOTAutograd, so a training step differentiates the
   decomposition itself; for an exported program, through ``run_decompositions``): its ATen
   ops are ordinary nodes that the normal passes fuse with the op's producers and consumers.

With ``dispatch_on`` and ``split_points``, a site whose size is symbolic is checked and timed
per range of that size; where the ranges' winners differ, the op's node stays and the generated
wrapper dispatches on the size (``Dispatch``).

Choices are cached on disk (``$FXFORGE_CACHE_DIR/custom_ops``), keyed by the op, the candidates'
source code and parameters, the site's input shapes and dtypes and its neighbours, the device,
this CPU and the thread count: a second process reuses them without checking or timing again.
Modules: ``register``, ``check``, ``context`` (where candidates are timed), ``tune`` (one
site), ``graphs`` (every site of a graph, inlining, dispatch).  Details: docs/custom-ops.md.
"""

from .context import Context, Setting, context_of
from .graphs import Dispatch, Dispatches, decomposition_table, inline_winners, tuned_sites
from .register import _TUNINGS, CustomOpConfig, Tuning, register_custom_op_autotuning, registered  # noqa: F401 (tests)
from .tune import TIMING, tune_site

__all__ = ["TIMING", "Context", "CustomOpConfig", "Dispatch", "Dispatches", "Setting", "Tuning", "context_of",
           "decomposition_table", "inline_winners", "register_custom_op_autotuning", "registered", "tune_site",
           "tuned_sites"]
