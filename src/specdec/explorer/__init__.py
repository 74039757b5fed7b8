"""The explorer: the spec's three interactive figures and a live view, as a local web page.

Every figure is driven by the engine through a small JSON API (``server``); nothing of the rule is
re-implemented in the browser. ``make_server(port=0)`` gives a server on an ephemeral loopback port;
``serve_forever()`` runs it (``specdec explore`` does both).
"""

from .server import ExplorerServer, make_server

__all__ = ["ExplorerServer", "make_server"]
