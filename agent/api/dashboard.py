"""The on-call web dashboard: `/` and `/dashboard` serve one static page that reads the JSON API.

The page is plain files in `dashboards/web/` (no build step, nothing from a CDN, so it works on closed
networks). Only files found directly in that folder with a known type are served, looked up by name
in a table built at start, so no request path can reach anything else. Every response carries a
strict Content-Security-Policy (this origin only, no inline script, no frames) and `nosniff`.
The page only reads: it needs no admin token and offers no mutating action.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

import dashboards

WEB_DIR = Path(dashboards.__file__).resolve().parent / "web"
INDEX = "index.html"

MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)

SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def static_files(root: Path = WEB_DIR) -> dict[str, Path]:
    """The servable files by name: regular files directly in `root` with a known type, no dotfiles."""
    if not root.is_dir():
        return {}
    return {
        path.name: path
        for path in sorted(root.iterdir())
        if path.is_file() and not path.name.startswith(".") and path.suffix in MEDIA_TYPES
    }


def dashboard_routes(root: Path = WEB_DIR) -> APIRouter:
    """`GET /`, `/dashboard` (the page) and `/static/{name}` (its files), outside the API schema."""
    files = static_files(root)
    router = APIRouter(include_in_schema=False)

    def serve(name: str) -> Response:
        path = files.get(name)
        if not files:
            return _not_found(f"the dashboard's files are missing from {root}; reinstall medic")
        if path is None:
            return _not_found(
                f"no dashboard file named {name[:100]!r}; the page's files are: {', '.join(files)}"
            )
        try:
            body = path.read_bytes()  # read per request: a few KiB, and edits show without a restart
        except OSError as exc:
            return _not_found(f"dashboard file {name!r} cannot be read ({exc.strerror}); reinstall medic")
        return Response(body, media_type=MEDIA_TYPES[path.suffix], headers=SECURITY_HEADERS)

    @router.api_route("/", methods=["GET", "HEAD"])
    def index() -> Response:
        return serve(INDEX)

    @router.api_route("/dashboard", methods=["GET", "HEAD"])
    def dashboard() -> Response:
        return serve(INDEX)

    @router.api_route("/static/{name}", methods=["GET", "HEAD"])
    def static(name: str) -> Response:
        return serve(name)

    return router


def _not_found(message: str) -> Response:
    return JSONResponse({"error": message}, status_code=404, headers=SECURITY_HEADERS)
