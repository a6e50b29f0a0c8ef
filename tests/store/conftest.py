from store_helpers import opener

__all__ = ["opener"]
