"""The HTTP face of the server: the FastAPI app, its edge and fast lane, routes and schemas.

:func:`gnnaas.serving.http.app.create_app` builds the app around a
:class:`~gnnaas.serving.core.router.Router`; one request parser and one error mapping
(:mod:`gnnaas.serving.http.requests`) serve both the FastAPI route and the fast lane.
"""
