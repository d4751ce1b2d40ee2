"""gnnaas: dynamic, model-less inference serving for graph neural networks."""

from gnnaas.errors import ArtifactError, ConfigError, GnnaasError, OverloadedError

__version__ = "0.1.0"

__all__ = ["ArtifactError", "ConfigError", "GnnaasError", "OverloadedError", "__version__"]
