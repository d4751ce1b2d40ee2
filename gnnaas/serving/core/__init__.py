"""The serving core: what decides and computes, free of FastAPI types.

The variant registry and its profiles, the selection policy, the dynamic batcher, the router with
its measured load, reloads, drift and metrics, the settings, and the live graph's writer. The HTTP
face (:mod:`gnnaas.serving.http`) and the deployments (:mod:`gnnaas.serving.deploy`) import these
modules; none of them imports those.
"""
