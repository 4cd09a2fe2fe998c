"""Self-contained HTML reports of compiled graphs."""
