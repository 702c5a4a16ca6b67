"""Plumbing the domain stands on: atomic writes, trusted reads, YAML files, user code, signals, units."""
