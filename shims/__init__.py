"""Code that runs inside sandboxes, shipped as package data (never built up in Python)."""
