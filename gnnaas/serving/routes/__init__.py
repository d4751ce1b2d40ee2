"""HTTP routes, one module per resource."""

from gnnaas.serving.routes import admin, datasets, health, predict

__all__ = ["admin", "datasets", "health", "predict"]
