"""modeld: serve LLM sessions through certified specialization cells."""
__version__ = "0.1.0"
