"""``TORCH_LOGS="fxforge_plan"``: fxforge logs the memory plan of every graph it compiles.

An importable name for torch's log settings (which read ``TORCH_LOGS`` when torch is imported,
before fxforge is); the logging is done by ``fxforge.infra.logs``.
"""
