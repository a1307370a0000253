"""The watched copy of an etcd range (`etcd_watch.KeyWatch`) against a real etcd: it follows puts and
deletes, resumes from its last revision after a dropped stream, and reads again after a compaction."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remediation.coordinator.etcd_gateway import EtcdGateway, b64
from remediation.coordinator.etcd_watch import KeyWatch, _Compacted
from remediation.errors import CoordinatorError
from support.remediation import NEEDS_ETCD, etcd_server


@pytest.fixture(scope="module")
def etcd_url():
    with etcd_server() as url:
        yield url


def put(gw: EtcdGateway, key: str, value: str) -> int:
    return int(gw.call("kv/put", gw.put_op(key, value)["request_put"])["header"]["revision"])


def until(fn, timeout=5.0):
    end = time.monotonic() + timeout
    while not fn():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


@NEEDS_ETCD
@pytest.mark.slow
def test_it_follows_puts_and_deletes_and_resumes_after_a_dropped_stream(etcd_url):
    gw = EtcdGateway([etcd_url], 2.0)
    prefix = f"/w{uuid.uuid4().hex[:6]}/"
    put(gw, prefix + "a", "1")
    watch = KeyWatch(gw, prefix)
    watch.start()
    try:
        assert watch.get(prefix + "a")["value"] == "1"
        put(gw, prefix + "b", "2")
        until(lambda: watch.get(prefix + "b") is not None)
        gw.call("kv/deleterange", {"key": b64(prefix + "a")})
        until(lambda: watch.get(prefix + "a") is None)
        watch.drop()  # the stream's connection is cut (etcd restarted, a proxy closed it)
        until(lambda: not watch.fresh or watch.reconnects > 0)
        put(gw, prefix + "c", "3")  # written while it may be reconnecting: not lost
        until(lambda: watch.get(prefix + "c") is not None and watch.fresh)
        assert watch.reconnects >= 1 and watch.rereads == 0  # resumed, not read again
        assert sorted(watch.items()) == [prefix + "b", prefix + "c"]
    finally:
        watch.close()
        gw.close()


@NEEDS_ETCD
@pytest.mark.slow
def test_a_compacted_revision_is_handled_by_reading_again(etcd_url):
    gw = EtcdGateway([etcd_url], 2.0)
    prefix = f"/w{uuid.uuid4().hex[:6]}/"
    put(gw, prefix + "a", "1")
    watch = KeyWatch(gw, prefix)
    watch._reread()  # the copy is at revision R; no stream yet (as if it had been down a long time)
    for i in range(3):
        last = put(gw, prefix + "a", str(i + 2))
    gw.call("kv/compaction", {"revision": str(last), "physical": True})  # R + 1 is gone
    watch._thread = threading.Thread(target=watch._run, daemon=True)
    watch._thread.start()
    try:
        until(lambda: watch.rereads >= 1 and watch.get(prefix + "a")["value"] == "4")
        put(gw, prefix + "z", "after")
        until(lambda: watch.get(prefix + "z") is not None)
    finally:
        watch.close()
        gw.close()


MESSAGES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["result", "events", "kv", "key", "type", "header", "revision", "compact_revision",
                         "canceled", "created", "error", "mod_revision", "value"]),
        inner, max_size=4),
    max_leaves=10,
)  # fmt: skip


@given(MESSAGES)
def test_any_watch_message_is_applied_or_refused_with_a_clear_error(message):
    watch = KeyWatch(EtcdGateway(["http://127.0.0.1:9"], 0.1), "/p/")
    try:
        watch._apply(json.loads(json.dumps(message)))
    except (ValueError, CoordinatorError, _Compacted):
        pass
    watch.gateway.close()
