"""Request handlers of the broker, one module per concern; each class registers its codes."""
