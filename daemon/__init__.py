"""Conduit."""
