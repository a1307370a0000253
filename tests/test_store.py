"""The SQLite store: batched samples, exact rollups, bounded series, durable events, retention, permissions."""

from __future__ import annotations

import os
import stat
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.core.errors import StoreError
from agent.core.records import Event, Sample
from agent.state.store import READER_CACHE_KIB, Store

T0 = 1_800_000_000.0  # a fixed "now" so buckets are deterministic


def fill(
    store: Store, seconds: int, instance: str = "a", metric: str = "rss_bytes", every: float = 1.0
) -> None:
    store.add_samples(
        Sample(instance, metric, T0 - seconds + i * every, float(i)) for i in range(int(seconds / every))
    )
    store.flush()


def test_samples_are_buffered_until_flush(tmp_path):
    store = Store(tmp_path)
    store.add_samples([Sample("a", "rss_bytes", T0, 1.0)])
    assert store.pending() == 1
    assert store.series("a", "rss_bytes", T0 - 10, now=T0).points == []
    assert store.flush() == 1
    assert store.series("a", "rss_bytes", T0 - 10, now=T0).points == [(T0, 1.0)]


def test_non_finite_values_are_dropped(tmp_path):
    store = Store(tmp_path)
    store.add_samples([Sample("a", "m", T0, float("nan")), Sample("a", "m", T0 + 1, float("inf"))])
    assert store.pending() == 0


def test_raw_series_bucketed_by_step(tmp_path):
    store = Store(tmp_path)
    fill(store, 100)
    result = store.series("a", "rss_bytes", T0 - 100, T0, step=10, now=T0)
    assert result.source == "raw"
    assert len(result.points) == 10
    assert result.points[0][1] == pytest.approx(4.5)
    assert store.series("a", "rss_bytes", T0 - 100, T0, step=10, agg="max", now=T0).points[0][1] == 9.0
    assert store.series("a", "rss_bytes", T0 - 100, T0, step=10, agg="min", now=T0).points[0][1] == 0.0


def test_long_ranges_come_from_rollups_and_are_capped(tmp_path):
    store = Store(tmp_path)
    fill(store, 6 * 3600, every=5.0)
    result = store.series("a", "rss_bytes", T0 - 6 * 3600, T0, max_points=100, now=T0)
    assert result.source == "rollup"
    assert len(result.points) <= 101
    assert result.step >= 6 * 3600 / 100
    everything = sum(range(6 * 3600 // 5)) / (6 * 3600 // 5)
    weighted = sum(v for _, v in result.points) / len(result.points)
    assert weighted == pytest.approx(everything, rel=0.05)


def test_rollups_stay_exact_across_flushes_and_reopen(tmp_path):
    store = Store(tmp_path)
    bucket = T0 - T0 % 60
    store.add_samples([Sample("a", "m", bucket + 1, 10.0), Sample("a", "m", bucket + 2, 20.0)])
    store.flush()
    store.close()
    store = Store(tmp_path)
    store.add_samples([Sample("a", "m", bucket + 3, 60.0)])
    store.flush()
    row = store.query("SELECT min, max, sum, count FROM rollups")[0]
    assert row == (10.0, 60.0, 90.0, 3)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    points=st.lists(
        st.tuples(st.integers(0, 179), st.integers(-(10**6), 10**6), st.booleans()), min_size=1, max_size=40
    )
)
def test_rollups_are_the_min_max_sum_and_count_of_each_minute_however_flushed(tmp_path_factory, points):
    store = Store(tmp_path_factory.mktemp("store"))
    bucket = T0 - T0 % 60
    for second, value, flush_after in points:  # one sample per second at most: the last one stays
        store.add_samples([Sample("a", "m", bucket + second, float(value))])
        if flush_after:
            store.flush()
    store.flush()
    kept: dict[int, float] = {second: float(value) for second, value, _ in points}
    every: dict[int, list[float]] = {}
    for second, value, _ in points:
        every.setdefault(second // 60, []).append(float(value))
    rows = store.query("SELECT ts, min, max, sum, count FROM rollups ORDER BY ts")
    assert rows == [
        (bucket + minute * 60, min(v), max(v), sum(v), len(v)) for minute, v in sorted(every.items())
    ]
    assert len(store.series("a", "m", bucket, bucket + 180, now=bucket + 180).points) == len(kept)
    store.close()


def test_events_are_durable_and_queryable(tmp_path):
    store = Store(tmp_path)
    first = store.add_event(Event("instance_discovered", "watching pid 1", instance="a", ts=T0))
    store.add_event(
        Event("probe_error", "denied", instance="b", severity="warning", data={"probe": "smaps"}, ts=T0 + 1)
    )
    store.add_event(Event("agent_stopped", "bye", ts=T0 + 2))
    store.close()
    store = Store(tmp_path)
    newest = store.events()
    assert [e.kind for e in newest] == ["agent_stopped", "probe_error", "instance_discovered"]
    assert store.events(instance="b")[0].data == {"probe": "smaps"}
    assert [e.kind for e in store.events(after_id=first.id)] == ["probe_error", "agent_stopped"]
    assert [e.kind for e in store.events(kinds=["agent_stopped"])] == ["agent_stopped"]
    assert [e.kind for e in store.events(since=T0 + 1)] == ["agent_stopped", "probe_error"]


def test_retention_deletes_only_what_is_past_it(tmp_path):
    store = Store(tmp_path)
    fill(store, 3600)
    store.add_event(Event("old", "x", ts=T0 - 10 * 86400))
    deleted = store.enforce_retention(T0, raw_retention=600, rollup_retention=86400)
    assert deleted["samples"] == 3000
    assert deleted["events"] == 1
    assert len(store.series("a", "rss_bytes", T0 - 3600, T0, max_points=5000, now=T0).points) == 600
    assert store.series("a", "rss_bytes", T0 - 3600, T0, step=60, now=T0 + 86400 * 3).points  # rollups kept


def test_instances_remembered_across_reopen(tmp_path):
    store = Store(tmp_path)
    store.remember_instance("a", 42, T0 - 5, T0)
    store.count_restart("a")
    store.close()
    record = Store(tmp_path).known_instances()["a"]
    assert (record.pid, record.start_time, record.restarts) == (42, T0 - 5, 1)


def test_files_are_private(tmp_path):
    store = Store(tmp_path / "state")
    store.add_samples([Sample("a", "m", T0, 1.0)])
    store.flush()
    assert stat.S_IMODE(os.stat(tmp_path / "state").st_mode) == 0o700
    for name in os.listdir(tmp_path / "state"):
        assert stat.S_IMODE(os.stat(tmp_path / "state" / name).st_mode) == 0o600, name


def test_unusable_state_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreError, match=r"cannot open the state database .*state_dir is writable"):
        Store(blocker)


def test_concurrent_writers_and_readers(tmp_path):
    store = Store(tmp_path)
    errors = []

    def write(instance: str) -> None:
        try:
            for i in range(200):
                store.add_samples([Sample(instance, "m", T0 + i, float(i))])
                if i % 20 == 0:
                    store.flush()
                    store.add_event(Event("tick", str(i), instance=instance))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def read() -> None:
        try:
            for _ in range(50):
                store.series("w0", "m", T0 - 1, T0 + 300, now=T0 + 300)
                store.events(limit=5)
        except Exception as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(f"w{i}",)) for i in range(4)]
    threads += [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.flush()
    assert not errors
    for i in range(4):
        assert len(store.series(f"w{i}", "m", T0 - 1, T0 + 300, now=T0 + 300).points) == 200


def test_readers_of_ended_threads_are_closed_and_their_cache_is_bounded(tmp_path):
    # the API's worker threads end after a while idle and new ones start: each new thread's reader
    # must not leave the ended threads' connections (and their page caches) open behind it
    store = Store(tmp_path)
    fill(store, 3)
    caches: list[int] = []

    def read() -> None:
        store.query("SELECT COUNT(*) FROM samples")
        caches.append(store.query("PRAGMA cache_size")[0][0])

    for _ in range(20):
        thread = threading.Thread(target=read)
        thread.start()
        thread.join()
    assert store.reader_count() <= 1
    assert set(caches) == {-READER_CACHE_KIB}
    store.close()
    assert store.reader_count() == 0


def test_readers_are_as_many_as_read_at_once_not_one_per_thread(tmp_path):
    # the agent's job threads and API workers take turns: a reader is lent per read, so ten threads
    # reading one after the other share one connection, and two reading at once get two
    store = Store(tmp_path)
    fill(store, 60)
    for _ in range(10):
        thread = threading.Thread(target=lambda: store.series("a", "rss_bytes", T0 - 60, now=T0))
        thread.start()
        thread.join()
    assert store.reader_count() == 1

    inside, release = threading.Barrier(3), threading.Event()

    def read_slowly() -> None:
        with store._reader() as db:
            inside.wait(5)
            release.wait(5)
            assert db.execute("SELECT COUNT(*) FROM samples").fetchone() == (60,)

    threads = [threading.Thread(target=read_slowly) for _ in range(2)]
    for thread in threads:
        thread.start()
    inside.wait(5)
    assert store.reader_count() == 2
    assert store.query("PRAGMA cache_size") == [(-READER_CACHE_KIB,)]  # a third, while both are lent
    release.set()
    for thread in threads:
        thread.join()
    assert store.reader_count() == 3
    store.close()
    assert store.reader_count() == 0
    with pytest.raises(StoreError, match="closed"):
        store.query("SELECT 1")


def test_a_corrupt_database_is_called_corrupt_with_what_to_do(tmp_path):
    """Not a permission problem: the file is damaged, and the fix is to move it aside."""
    state = tmp_path / "state"
    Store(state).close()
    db = state / "medic.db"
    db.write_bytes(b"\x93garbage, not SQLite" * 500)  # what a disk error or a stray copy leaves
    with pytest.raises(StoreError) as raised:
        Store(state)
    message = str(raised.value)
    assert f"the state database {db} is corrupt" in message and f"mv {db} {db}.corrupt" in message
    assert "writable" not in message and "medic.db-wal" in message

    damaged = tmp_path / "damaged"
    store = Store(damaged)
    store.add_samples(
        Sample("svc", f"m{i}", 1_700_000_000.0 + k, float(k)) for i in range(40) for k in range(50)
    )
    store.flush()
    store.close()
    path = damaged / "medic.db"
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    data[2 * page : len(data) - page] = b"\xff" * (
        len(data) - 3 * page
    )  # the header holds, the tree does not
    path.write_bytes(bytes(data))
    try:
        reopened = Store(damaged)
    except StoreError as exc:  # SQLite may notice at once
        assert "is corrupt" in str(exc) and "writable" not in str(exc)
        return
    reopened.add_samples([Sample("svc", "m0", 1_700_000_100.0, 1.0)])
    with pytest.raises(StoreError, match="is corrupt: stop medic, move it aside"):
        reopened.flush()
    reopened.close()
