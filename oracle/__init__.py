"""Independent NumPy oracles. Imports nothing from modeld (a test enforces it)."""
