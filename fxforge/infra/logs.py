"""What fxforge writes to Python's logging, under the names torch's ``TORCH_LOGS`` takes:

* ``TORCH_LOGS="fxforge"``: nodes run as eager fallbacks (INFO; graphs and calls that fell back
  are WARNINGs, shown by default); ``"+fxforge"`` adds one line per compiled graph (DEBUG);
* ``TORCH_LOGS="fxforge_plan"``: the memory plan of every compiled graph (``MemoryPlan.dump``);
* ``TORCH_LOGS="fxforge_code"``: the generated code of every compiled graph (``Compiled.source``).

Torch reads ``TORCH_LOGS`` when it is imported and accepts the names of importable modules
there: ``fxforge_plan`` and ``fxforge_code`` are two empty modules installed with fxforge, and
their loggers are apart from ``fxforge``'s, so ``"fxforge"`` and ``"+fxforge"`` leave them out.
"""

from __future__ import annotations

import logging

PLAN = logging.getLogger("fxforge_plan")
CODE = logging.getLogger("fxforge_code")
