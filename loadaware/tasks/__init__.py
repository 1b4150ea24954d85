"""Background tasks: run, restarted with backoff, counted (supervisor.py)."""
