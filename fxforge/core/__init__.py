"""Core data, below every other layer: the node-metadata vocabulary (``graph``), the plan, the
loop-nest vocabulary (``iteration``), ``Config``, and what collectives, copies, regions and
DTensor placements are."""
