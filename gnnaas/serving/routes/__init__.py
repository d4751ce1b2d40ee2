"""HTTP routes, one module per resource."""

from gnnaas.serving.routes import datasets, health, predict

__all__ = ["datasets", "health", "predict"]
