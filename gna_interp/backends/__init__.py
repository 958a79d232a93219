"""Backends: each implements `Backend.run` (one forward with a plan applied)."""
