"""The prefix sources, one module each (a `SourceSpec` and what it builds); prefix/registry.py lists them."""
