"""The HTTP surface: the FastAPI app and routers, auth, the guard middleware, the server protocol, /metrics."""
