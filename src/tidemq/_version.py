"""The package version, in a module of its own so servers can report it without importing the
client API that `tidemq/__init__.py` re-exports."""

__version__ = "0.1.0"
