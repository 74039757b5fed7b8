"""The explorer: the spec's three interactive figures and a live view, as a local web page.

Every figure is driven by the engine through a small JSON API (``routes``, on FastAPI); nothing of
the rule is re-implemented in the browser. ``create_app()`` is the explorer's ASGI app, which
``specdec explore`` serves with uvicorn (``server.runner``); ``add_explorer(app)`` puts the same
page and API on another app (``specdec serve`` does, at /explorer).
"""

from .app import Explorer, add_explorer, create_app, make_explorer

__all__ = ["Explorer", "add_explorer", "create_app", "make_explorer"]
