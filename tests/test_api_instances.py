"""`/api/v1/instances`: one answer per tick served as bytes, with an ETag that gives 304 until the next
tick; fields selected and pages walked with `after`/`next` add up to the whole list."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.api.instances import _json, etag_matches, instance_fields
from agent.api.snapshots import TickCache, Ticks
from agent.cli.status import TABLE_FIELDS
from support.http_guard import World

NAMES = [f"svc-{i}" for i in range(5)]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    children = [subprocess.Popen(["sleep", "300"]) for _ in NAMES]
    made = World(
        tmp_path_factory.mktemp("instances"),
        children[0].pid,
        instances=[{"name": name, "match": {"pid": c.pid}} for name, c in zip(NAMES, children)],
    )
    made.tracker.reconcile(time.time(), scan=True)
    try:
        yield made
    finally:
        made.close()
        for child in children:
            child.kill()
            child.wait()


def get(world: World, path: str, **headers: str):
    return world.request("GET", path, headers=headers)


def test_the_whole_list_is_as_before_and_served_again_until_a_tick(world):
    first = get(world, "/api/v1/instances")
    assert first.status_code == 200 and first.headers["content-type"] == "application/json"
    body = first.json()
    assert set(body) == {"now", "time_scale", "instances"}
    assert [i["name"] for i in body["instances"]] == NAMES
    assert all(i["status"] == "up" and tuple(i) == instance_fields() for i in body["instances"])
    assert get(world, "/api/v1/instances").content == first.content  # the same bytes between ticks
    world.telemetry.changed()
    later = get(world, "/api/v1/instances")
    assert later.json()["now"] > body["now"] and later.headers["etag"] != first.headers["etag"]


def test_the_answer_encoded_instance_by_instance_is_what_the_whole_dict_encodes_to(world):
    for path in ("/api/v1/instances", "/api/v1/instances?limit=2&after=svc-0&fields=status,latest"):
        data = get(world, path).content
        assert data == _json().dump_json(json.loads(data)), path


def test_a_tick_cache_builds_once_per_tick_and_keeps_what_its_bounds_allow():
    ticks, builds = Ticks(), []

    def build(value: bytes):
        builds.append(value)
        return value

    cache = TickCache(ticks, max_age=3600.0, size=3, budget=10, weigh=len)
    assert cache.peek("a") is None
    assert cache.get("a", lambda: build(b"aaaa")) == b"aaaa" and cache.peek("a") == b"aaaa"
    assert cache.get("a", lambda: build(b"other")) == b"aaaa" and builds == [b"aaaa"]
    ticks.changed()
    assert cache.peek("a") is None and cache.get("a", lambda: build(b"a2")) == b"a2"
    cache.get("b", lambda: build(b"bbbb"))
    cache.get("c", lambda: build(b"cccc"))  # 2 + 4 + 4 bytes: within the budget of 10
    assert len(cache) == 3
    cache.get("d", lambda: build(b"dd"))  # four keys: the one asked for longest ago goes
    assert cache.peek("a") is None and len(cache) == 3
    cache.get("e", lambda: build(b"e" * 50))  # over the budget alone: kept, the others go
    assert cache.peek("e") == b"e" * 50 and len(cache) == 1
    cache.max_age = 0.0
    assert cache.peek("e") is None  # as old as max_age: built again


def test_an_etag_sent_back_gets_304_until_the_next_tick(world):
    first = get(world, "/api/v1/instances?fields=status")
    etag = first.headers["etag"]
    assert first.headers["cache-control"] == "no-cache"
    for sent in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        again = get(world, "/api/v1/instances?fields=status", **{"If-None-Match": sent})
        assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag, sent
    assert get(world, "/api/v1/instances", **{"If-None-Match": etag}).status_code == 200  # another variant
    assert get(world, "/api/v1/instances?fields=status", **{"If-None-Match": '"other"'}).status_code == 200
    world.telemetry.changed()
    assert get(world, "/api/v1/instances?fields=status", **{"If-None-Match": etag}).status_code == 200


def test_gzip_for_who_accepts_it_the_same_list_with_its_own_etag(world):
    zipped = get(world, "/api/v1/instances", **{"Accept-Encoding": "gzip"})
    plain = get(world, "/api/v1/instances", **{"Accept-Encoding": "identity"})
    assert zipped.headers["content-encoding"] == "gzip" and "content-encoding" not in plain.headers
    assert zipped.headers["vary"] == plain.headers["vary"] == "Accept-Encoding"
    # httpx has gunzipped it; each variant is built when first asked, so `now` may differ
    assert [tuple(i) for i in zipped.json()["instances"]] == [tuple(i) for i in plain.json()["instances"]]
    assert zipped.headers["etag"] != plain.headers["etag"]
    again = get(
        world, "/api/v1/instances", **{"Accept-Encoding": "gzip", "If-None-Match": zipped.headers["etag"]}
    )
    assert again.status_code == 304


def test_an_unknown_field_is_named_with_the_known_ones(world):
    answer = get(world, "/api/v1/instances?fields=status,rss,pid")
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert "'rss'" in error and "rss_bytes" in error and "\n" not in error


def test_medic_status_asks_for_fields_an_instance_has():
    assert set(TABLE_FIELDS) <= set(instance_fields())


@settings(max_examples=40, deadline=None, database=None)
@given(
    fields=st.one_of(st.none(), st.sets(st.sampled_from(instance_fields()), max_size=6)),
    limit=st.integers(min_value=1, max_value=7),
)
def test_pages_and_fields_add_up_to_the_whole_list(world, fields, limit):
    query = f"&fields={','.join(sorted(fields))}" if fields is not None else ""
    seen, after, pages = [], None, 0
    while True:
        path = f"/api/v1/instances?limit={limit}{query}" + (f"&after={after}" if after else "")
        body = get(world, path).json()
        pages += 1
        assert len(body["instances"]) <= limit
        for inst in body["instances"]:
            assert set(inst) == (fields | {"name"} if fields is not None else set(instance_fields()))
        seen += [inst["name"] for inst in body["instances"]]
        after = body["next"]
        if after is None:
            break
        assert after == seen[-1] and pages <= len(NAMES)
    assert seen == NAMES


@given(st.text(max_size=60), st.text(max_size=30))
def test_if_none_match_is_read_without_surprises(header, tag):
    etag = f'"{tag}"'
    assert etag_matches(header, etag) == any(
        part.strip() in ("*", etag, f"W/{etag}") for part in header.split(",")
    )
