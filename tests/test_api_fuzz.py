"""Every route of the API, driven with hostile values, answers with a 2xx/3xx/4xx: never a 500, never a crash.

The routes and their parameters come from the app itself (`app.routes`), so a new route or parameter
is covered without touching this file. Values: huge and negative integers, inf/nan, long and
control-character strings, deep JSON; with the valid token, a wrong one and none.
"""

from __future__ import annotations

import json
import subprocess
import typing
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.api.guard import api_routes
from support.http_guard import TOKEN, World

NASTY_TEXT = [
    "inf",
    "-inf",
    "nan",
    "1e309",
    "-1e309",
    "1e308",
    "99999999999999999999999",
    "-99999999999999999999999",
    "9" * 400,
    "0",
    "-1",
    "0x10",
    "",
    " ",
    "1h",
    "1e300s",
    "99999999999w",
    "\x00",
    "\x1b[31m",
    "\r\nX-Injected: 1",
    "../../etc/passwd",
    "é😀",
    "'; DROP TABLE events; --",
]
SCALARS = st.one_of(
    st.sampled_from(NASTY_TEXT),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=40),
    st.text(min_size=2000, max_size=5000, alphabet="a\x01\x7f9."),
)
JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    st.sampled_from(NASTY_TEXT),
)
JSON_VALUE = st.recursive(
    JSON_LEAF,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def build_world(tmp_path, spawn) -> World:
    child = spawn(["sleep", "60"], stdout=subprocess.DEVNULL)
    return World(tmp_path, child.pid)


def routes(app) -> list[tuple[str, str, Any]]:
    """(method, path template, route) for every route of the app, as the guard sees them."""
    return [
        (method, route.path, route) for route in api_routes(app.routes) for method in sorted(route.methods)
    ]


AUTH = {
    "valid": {"Authorization": f"Bearer {TOKEN}"},
    "wrong": {"Authorization": "Bearer " + "b" * 64},
    "none": {},
    "garbage": {"Authorization": "Basic \x01\x02"},
}
NASTY_BODIES = [
    b"",
    b"null",
    b"[]",
    b"{}",
    b"Infinity",
    b'{"reason": NaN}',
    b'{"reason": 1e999}',
    b'{"ids": [99999999999999999999999]}',
    b'{"ids": [-1, 0]}',
    b'{"\\n": null, "\\u2028x": 1}',  # keys the validation error names: still one line
    b'{"reason": "\\u0000\\u001b", "duration": "99999999999w"}',
    b'{"duration": "1e308s", "reason": "xyz"}',
    b'{"reason": "' + b"x" * 60_000 + b'"}',
    b"\xff\xfe",
    b"{" * 40,
    deep(33).encode(),
    deep(5000).encode(),
    deep(60_000).encode(),
    ("{" + '"a":{' * 2000 + "}" * 2001).encode(),
]


@st.composite
def requests(draw, method: str, template: str, route: Any):
    path_params, query_params = parameters(route.dependant)
    path = template
    for param in path_params:
        value = draw(st.one_of(st.just("svc"), SCALARS.filter(bool)))
        path = path.replace("{" + param.alias + "}", quote(value, safe=""))
    params = []
    for param in query_params:
        if draw(st.booleans()):
            for _ in range(draw(st.integers(1, 2))):
                params.append((param.alias, draw(SCALARS)))
    headers = AUTH[draw(st.sampled_from(sorted(AUTH)))]
    content = None
    if method in ("POST", "PUT", "PATCH"):
        fields = body_fields(route)
        kind = draw(st.sampled_from(["model", "json", "nasty", "bytes"]))
        if kind == "model" and fields:
            body = {
                name: draw(JSON_VALUE)
                for name in draw(st.lists(st.sampled_from(fields), max_size=len(fields), unique=True))
            }
            content = json.dumps(body).encode()
        elif kind in ("model", "json"):
            content = json.dumps(draw(JSON_VALUE)).encode()
        elif kind == "nasty":
            content = draw(st.sampled_from(NASTY_BODIES))
        else:
            content = draw(st.binary(max_size=300))
        headers = {**headers, "Content-Type": "application/json"}
    return method, path, params, headers, content


def parameters(dependant) -> tuple[list, list]:
    """The path and query parameters of a route and of all its dependencies."""
    path, query = list(dependant.path_params), list(dependant.query_params)
    for sub in dependant.dependencies:
        more_path, more_query = parameters(sub)
        path += more_path
        query += more_query
    return path, query


def body_fields(route: Any) -> list[str]:
    """The field names of the route's body model (`Model` or `Model | None`), if it has one."""
    if route.body_field is None:
        return []
    annotation = route.body_field.field_info.annotation
    for candidate in (annotation, *typing.get_args(annotation)):
        if hasattr(candidate, "model_fields"):
            return sorted(candidate.model_fields)
    return []


@pytest.fixture
def world(tmp_path, spawn):
    made = build_world(tmp_path, spawn)
    yield made
    made.close()


def test_the_table_covers_every_route(world):
    table = routes(world.app)
    paths = {path for _, path, _ in table}
    for expected in (
        "/api/v1/events",
        "/api/v1/instances/{name}/attribution",
        "/api/v1/alertmanager",
        "/api/v1/pause",
        "/api/v1/outbox/requeue",
    ):
        assert expected in paths
    assert any(method == "POST" for method, _, _ in table)


def check(world: World, method: str, path: str, **kwargs: Any) -> None:
    """No 500 (an exception in the app is raised by the transport), and a one-line JSON error."""
    response = world.request(method, path, **kwargs)
    assert response.status_code < 500, (method, path, kwargs.get("params"), response.text[:300])
    if response.status_code >= 400 and method != "HEAD":
        assert response.headers["content-type"].startswith("application/json"), response.text[:300]
        error = response.json()["error"]
        assert isinstance(error, str) and "\n" not in error


def test_every_query_and_path_parameter_with_every_nasty_value(world):
    for method, template, route in routes(world.app):
        path_params, query_params = parameters(route.dependant)
        concrete = template
        for param in path_params:
            concrete = concrete.replace("{" + param.alias + "}", "svc")
        for value in NASTY_TEXT:
            for param in query_params:
                check(world, method, concrete, params={param.alias: value}, headers=AUTH["valid"])
            for param in path_params:
                if value and "/" not in value:
                    nasty = template.replace("{" + param.alias + "}", quote(value, safe=""))
                    check(world, method, nasty.replace("{name}", "svc"), headers=AUTH["valid"])


def test_every_body_route_with_every_nasty_body(world):
    for method, path, _ in routes(world.app):
        if method != "POST":
            continue
        path = path.replace("{name}", "svc")
        for body in NASTY_BODIES:
            for auth in ("valid", "none"):
                headers = {**AUTH[auth], "Content-Type": "application/json"}
                check(world, method, path, content=body, headers=headers)


def test_random_requests_to_every_route(world):
    for method, template, route in routes(world.app):

        @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
        @given(request=requests(method, template, route))
        def no_500(request) -> None:
            method_, path, params, headers, content = request
            check(world, method_, path, params=params, headers=headers, content=content)

        no_500()
