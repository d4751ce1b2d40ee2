"""HTTP routes, one module per resource."""

from gnnaas.serving.http.routes import admin, datasets, health, predict

__all__ = ["admin", "datasets", "health", "predict"]
