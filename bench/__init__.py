"""Conduit's benchmark (`python bench/run.py`): the parts, one module each."""
