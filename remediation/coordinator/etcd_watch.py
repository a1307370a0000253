"""A local copy of an etcd key range, kept current by one watch stream through the JSON gateway.

`start()` reads the range once (its revision R), then a thread streams `POST /v3/watch` from
R + 1 and applies each PUT and DELETE to the copy. After a disconnect it resumes from the last
revision it applied, so no event is lost; when etcd has compacted that revision away, the copy is
re-read whole and the watch starts again after the new read. While the stream is down the copy is
marked stale (`fresh` is False): callers that act on it fail closed until it is back.

The stream uses the gateway's own HTTP client, so its TLS and authentication settings apply. Each
line the gateway sends is bounded (`MAX_LINE`); an idle stream is re-opened after `idle_timeout`
(a half-open connection to a vanished etcd cannot hang it forever).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from remediation.coordinator.etcd_gateway import (
    EtcdGateway,
    answer_int,
    answer_list,
    answer_revision,
    b64,
    prefix_end,
)
from remediation.errors import CoordinatorError

log = logging.getLogger("medic.remediation.etcd")
MAX_LINE = 4 * 1024 * 1024  # one watch response: a txn of 100 puts of small JSON values fits easily
IDLE_TIMEOUT = 300.0


class KeyWatch:
    """Keys under `key` (a prefix when `prefix`), by key: {"value", "create_revision", "mod_revision", "lease"}."""

    def __init__(
        self,
        gateway: EtcdGateway,
        key: str,
        *,
        prefix: bool = True,
        on_change: Callable[[], None] | None = None,
        idle_timeout: float = IDLE_TIMEOUT,
    ) -> None:
        self.gateway = gateway
        self.key = key
        self.prefix = prefix
        self.on_change = on_change
        self.idle_timeout = idle_timeout
        self.revision = 0
        self.reconnects = 0
        self.rereads = 0
        self._kvs: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._fresh = False
        self._stop = threading.Event()
        self._response: httpx.Response | None = None
        self._thread: threading.Thread | None = None

    # ----------------------------------------------------------------------------- reading
    @property
    def fresh(self) -> bool:
        """True while the stream is open and the copy is current."""
        return self._fresh

    def items(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return dict(self._kvs)

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            return self._kvs.get(key)

    # ----------------------------------------------------------------------------- life cycle
    def start(self) -> None:
        """Read the range (raises `CoordinatorUnavailable` when etcd does not answer) and start watching."""
        self._reread()
        self._thread = threading.Thread(target=self._run, name=f"etcd-watch {self.key}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._fresh = False
        self.drop()

    def drop(self) -> None:
        """Cut the open stream's connection (a blocked read ends at once); the thread then resumes."""
        response = self._response
        if response is None:
            return
        try:
            stream = response.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
            response.close()
        except (OSError, RuntimeError, httpx.HTTPError):  # already closed: nothing to cut
            pass

    def _reread(self) -> None:
        body: dict[str, Any] = {"key": b64(self.key)}
        if self.prefix:
            body["range_end"] = prefix_end(self.key)
        data = self.gateway.call("kv/range", body)
        kvs = {}
        for raw in answer_list(data, "kvs"):
            kv = self.gateway._kv(raw)
            kvs[kv.pop("key")] = kv
        revision = answer_revision(data)
        with self._lock:
            self._kvs = kvs
            self.revision = revision
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:
                log.exception("etcd watch callback failed")

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                self._stream()
                backoff = 0.2
            except (_Compacted, CoordinatorError) as exc:  # compacted, or refused (e.g. an expired token)
                log.debug("etcd watch %s: %s; reading it again", self.key, exc or "compacted")
                self.rereads += 1
                try:
                    self._reread()
                except CoordinatorError as exc:
                    log.debug("etcd watch %s: re-read failed: %s", self.key, exc)
            except (httpx.HTTPError, ValueError, OSError) as exc:  # resumes from self.revision
                log.debug("etcd watch %s: %s", self.key, exc)
            except Exception:  # a bug must not end the watch: it stays stale (fail closed) and retries
                log.exception("etcd watch %s failed", self.key)
            self._fresh = False
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, 5.0)
            self.reconnects += 1

    def _stream(self) -> None:
        create: dict[str, Any] = {
            "key": b64(self.key),
            "start_revision": str(self.revision + 1),
            "progress_notify": True,
        }
        if self.prefix:
            create["range_end"] = prefix_end(self.key)
        gw = self.gateway
        url = f"{gw.endpoints[gw._preferred % len(gw.endpoints)]}/v3/watch"
        timeout = httpx.Timeout(gw.timeout, read=self.idle_timeout)
        with gw._client.stream(
            "POST", url, content=json.dumps({"create_request": create}), timeout=timeout
        ) as response:
            self._response = response
            if response.status_code != 200:
                raise CoordinatorError(f"etcd watch answered HTTP {response.status_code}")
            buffer = b""
            for chunk in response.iter_bytes():
                if self._stop.is_set():
                    return
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        self._apply(json.loads(line))
                if len(buffer) > MAX_LINE:
                    raise CoordinatorError(f"etcd watch sent a line over {MAX_LINE} bytes")
            if buffer.strip():
                self._apply(json.loads(buffer))

    def _apply(self, message: Any) -> None:
        if not isinstance(message, dict):
            raise ValueError("etcd watch sent a non-object")
        if "error" in message:
            raise CoordinatorError(f"etcd watch failed: {message['error']}")
        result = message.get("result")
        if not isinstance(result, dict):
            raise ValueError("etcd watch sent no result")
        if answer_int(result, "compact_revision") > 0:
            raise _Compacted()
        if result.get("canceled"):
            raise CoordinatorError(f"etcd cancelled the watch: {result.get('cancel_reason', '?')}")
        events = []  # read whole before any is applied: a message is applied entirely or not at all
        for event in answer_list(result, "events"):
            if not isinstance(event, dict):
                raise ValueError("etcd watch sent an event that is not an object")
            kv = self.gateway._kv(event.get("kv") or {})
            events.append((kv.pop("key"), None if event.get("type") == "DELETE" else kv, kv["mod_revision"]))
        header = answer_revision(result)
        with self._lock:
            for key, record, revision in events:
                if record is None:
                    self._kvs.pop(key, None)
                else:
                    self._kvs[key] = record
                self.revision = max(self.revision, revision)
            if not events and not result.get("created") and header:
                # a progress notification: nothing before `header` is missing
                self.revision = max(self.revision, header)
        self._fresh = True
        if events:
            self._changed()


class _Compacted(Exception):
    """The revision to resume from is compacted: the copy must be read again."""


def wait_fresh(watch: KeyWatch, timeout: float) -> bool:
    """Wait up to `timeout` for the stream to be open (the first answer after `start`)."""
    end = time.monotonic() + timeout
    while not watch.fresh and time.monotonic() < end:
        time.sleep(0.01)
    return watch.fresh
