"""``tune dashboard``: optuna-dashboard over a study storage, served read-only.

The dashboard's own server lets a visitor delete studies, create them and fail trials; a command documented as
reading must not. Every request that is not a read (GET, HEAD) is answered 403 with the reason, which the
dashboard shows in its message bar; the storage under it answers the constrained best (tuner.storage).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

READ_METHODS = frozenset({"GET", "HEAD"})
READ_ONLY_REASON = (
    "tune dashboard serves the studies read-only: change a study with tune run, or delete it with optuna's own tools"
)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def read_only(app: WsgiApp) -> WsgiApp:
    """A WSGI app that passes reads to ``app`` and refuses every other method with 403 and the reason."""

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD", "GET").upper() in READ_METHODS:
            return app(environ, start_response)
        body = json.dumps({"reason": READ_ONLY_REASON}).encode()
        start_response("403 Forbidden", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    return serve


def dashboard_app(url: str) -> WsgiApp:
    """optuna-dashboard's WSGI app over the study storage at ``url``, read-only."""
    import optuna_dashboard

    from tuner.storage import dashboard_storage

    return read_only(optuna_dashboard.wsgi(dashboard_storage(url)))


def serve(app: WsgiApp, host: str, port: int) -> None:
    """Serve ``app`` (see :func:`dashboard_app`) on ``host:port`` until interrupted (Ctrl-C)."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """Requests are not logged line by line (optuna-dashboard's own server does not either)."""

    with make_server(host, port, app, handler_class=QuietHandler) as server:
        server.serve_forever()
