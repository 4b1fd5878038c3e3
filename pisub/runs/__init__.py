"""A run seen from outside: launch it, read, list and repair it."""
