"""Infrastructure every layer may use: the pass manager, progress lines, logging names, what
this machine is, timing under load, and the old import paths of moved modules."""
