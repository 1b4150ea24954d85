"""The discovery backends, one module each (a `Backend`); fleet/discovery/registry.py lists them."""
