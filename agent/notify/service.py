"""`Notifier`: the agent's notification service, run as asyncio tasks beside the scheduler.

Workers, each a loop of one blocking step in a thread, then a wait for a wake-up or a deadline:

- `router`: events → outbox (woken by every stored event), Alertmanager re-posts, stale
  external findings, pruning of old rows;
- one per sink: delivers its due items in order (woken when the router queued something);
- `silences`: creates and expires Alertmanager silences (woken by `silence_for`/`unsilence`).

Everything a worker does is in the store first, so stopping or killing the agent loses nothing:
the next start routes the events after the cursor and delivers what is pending.

Public API for the rest of medic:

    notifier = Notifier(section, store, events, labels_for=..., agent=..., external_url=...)
    events.subscribe(notifier.wake); notifier.start()   # the composition root (agent/runtime.py) does this
    notifier.silence_for(instance, action_id, until)
    notifier.unsilence(action_id)
    await notifier.stop()
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from agent.core.records import Event
from agent.notify.config import NotifySection
from agent.notify.external import ensure_external_schema, expire_external_findings
from agent.notify.metrics import NotifyCollector, NotifySnapshot
from agent.notify.model import Notification
from agent.notify.outbox import Outbox, OutboxItem
from agent.notify.router import Router
from agent.notify.silences import Silencer, SilenceTarget
from agent.notify.sinks import AlertmanagerSink, DeliveryError, HttpSink, create_sinks
from agent.state.eventlog import EventLog
from agent.state.store import Store

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("medic.notify")
IDLE = 5.0  # a worker with nothing due still looks again this often
PER_ROUND = 100  # items one sink delivers before yielding
HOUSEKEEPING = 60.0
STOP_GRACE = 3.0


class Notifier:
    def __init__(
        self,
        config: NotifySection,
        store: Store,
        events: EventLog,
        *,
        labels_for: Callable[[str], Mapping[str, str]] = lambda name: {},
        agent: str | None = None,
        external_url: str | None = None,
        clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.events = events
        self.clock = clock
        self.sinks: list[HttpSink] = create_sinks(config, transport=transport)
        self.outbox = Outbox(store, config.retry, rng)
        alertmanagers = [s for s in self.sinks if isinstance(s, AlertmanagerSink)]
        targets = silence_targets(alertmanagers)
        self.silencer = (
            Silencer(
                store,
                targets,
                config.receiver.instance_labels,
                refresh=min(s.spec.silence_refresh for s in alertmanagers if s.spec.silences),
                wake=lambda: self._wake("silences"),
                agent=agent,
            )
            if targets
            else None
        )
        self.router = Router(
            config,
            store,
            self.outbox,
            self.sinks,
            labels_for=labels_for,
            agent=agent,
            external_url=external_url,
            silences=self.silencer,
            silence_for=max((s.spec.silence_max for s in alertmanagers), default=1800.0),
            repost_interval=min((s.spec.repost_interval for s in alertmanagers), default=None),
        )
        ensure_external_schema(store)
        self.collector = NotifyCollector()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeups: dict[str, asyncio.Event] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._housekept = 0.0
        self._hold: dict[str, float] = {}  # sink -> no request before this time (its Retry-After)
        self.snapshot(clock())

    # ----------------------------------------------------------------------------- public API
    def silence_for(self, instance: str, action_id: str | int, until: float) -> None:
        """Silence the instance's firing alerts in every Alertmanager sink until `until` (unix time)
        or `unsilence(action_id)`; returns at once, the silences exist within about a second."""
        if self.silencer is not None:
            self.silencer.silence_for(instance, action_id, until, self.clock())

    def unsilence(self, action_id: str | int) -> None:
        """End the silences held for `action_id`; idempotent."""
        if self.silencer is not None:
            self.silencer.unsilence(action_id, self.clock())

    def wake(self, event: Event | None = None) -> None:
        """The EventLog subscriber: a new event is stored, route it soon. Cheap, never raises."""
        self._wake("router")

    # ----------------------------------------------------------------------------- one step each
    def route_once(self, now: float | None = None) -> float | None:
        now = self.clock() if now is None else now
        self.router.pump(now)
        repost_in = self.router.repost(now)
        if now - self._housekept >= HOUSEKEEPING:
            self._housekeeping(now)
        for name in [s.name for s in self.sinks] + [
            "silences"
        ]:  # cheap: an idle worker looks and sleeps again
            self._wake(name)
        self.snapshot(now)
        return repost_in

    def deliver_once(self, sink: HttpSink) -> float | None:
        """Deliver the sink's due items in order; seconds until its head item is due (None: empty).

        A `Retry-After` holds the whole sink, not only the item that got it: a rate limit is the
        target's (Slack's is per webhook), and a dead letter must not let the next item in early."""
        try:
            for _ in range(PER_ROUND):
                now = self.clock()
                item = self.outbox.head(sink.name)
                if item is None:
                    return None
                due = max(item.next_attempt_at, self._hold.get(sink.name, 0.0))
                if due > now:
                    return due - now
                try:
                    sink.send(Notification.from_dict(item.payload), item.id, now)
                except DeliveryError as exc:  # the backoff counts from the end of the attempt
                    ended = self.clock()
                    if exc.retry_after:
                        self._hold[sink.name] = ended + exc.retry_after
                    state = self.outbox.failed(item, str(exc), exc.retryable, ended, exc.retry_after)
                    if state == "dead":
                        self._dead_letter(sink, item, str(exc))
                    elif item.attempts == 0:
                        log.warning("%s: item %s failed, will retry: %s", sink.name, item.id, exc)
                except Exception as exc:  # a bug in rendering: no retry can fix it
                    log.exception("%s: cannot render item %s", sink.name, item.id)
                    error = f"internal error: {type(exc).__name__}: {exc}"
                    self.outbox.failed(item, error, False, self.clock())
                    self._dead_letter(sink, item, error)
                else:
                    self.outbox.delivered(item, self.clock())
            return 0.0
        finally:
            self.snapshot(self.clock())

    def _dead_letter(self, sink: HttpSink, item: OutboxItem, error: str) -> None:
        """Say in the event log (and `medic events`) that a notification was given up on."""
        what = item.payload.get("alertname") or item.kind
        self.events.emit(
            "notification_dead",
            f"{sink.name}: gave up on {what} after {item.attempts + 1} attempt(s): {error}",
            instance=item.instance,
            severity="error",
            sink=sink.name,
            item_id=item.id,
        )

    def silence_once(self, now: float | None = None) -> float | None:
        if self.silencer is None:
            return None
        delay = self.silencer.reconcile(self.clock() if now is None else now)
        self.snapshot(self.clock())
        return delay

    def snapshot(self, now: float) -> None:
        silences: dict[str, int] = {}
        if self.silencer is not None:
            for row in self.silencer.silences("active"):
                silences[row["sink"]] = silences.get(row["sink"], 0) + 1
        names = [s.name for s in self.sinks]
        self.collector.update(NotifySnapshot(now, self.outbox.stats(names), silences))

    def _housekeeping(self, now: float) -> None:
        self._housekept = now
        expire_external_findings(self.store, self.events, now, self.config.receiver.stale_after)
        self.outbox.prune(now, self.config.keep_delivered, self.config.keep_dead)
        self.router.prune(now, self.config.keep_delivered)

    # ----------------------------------------------------------------------------- asyncio
    def start(self) -> None:
        """Start the workers on the running loop."""
        self._loop = asyncio.get_running_loop()
        workers: dict[str, Callable[[], float | None]] = {"router": self.route_once}
        for sink in self.sinks:
            workers[sink.name] = functools.partial(self.deliver_once, sink)
        if self.silencer is not None:
            workers["silences"] = self.silence_once
        for name, step in workers.items():
            self._wakeups[name] = asyncio.Event()
            self._tasks.append(asyncio.create_task(self._worker(name, step), name=f"notify-{name}"))
        log.info("notifications: %s", ", ".join(f"{s.name} ({s.type})" for s in self.sinks) or "no sinks")

    async def stop(self) -> None:
        """Let each worker finish its step (a few seconds at most), then close the HTTP clients."""
        self._stopping = True
        for wakeup in self._wakeups.values():
            wakeup.set()
        if self._tasks:
            _, late = await asyncio.wait(self._tasks, timeout=STOP_GRACE)
            for task in late:
                task.cancel()
        for sink in self.sinks:
            sink.close()

    async def _worker(self, name: str, step: Callable[[], Any]) -> None:
        wakeup = self._wakeups[name]
        while not self._stopping:
            wakeup.clear()
            try:
                delay = await asyncio.to_thread(step)
            except Exception:
                log.exception("notify worker %s failed; it runs again in %.0fs", name, IDLE)
                delay = IDLE
            if self._stopping:
                return
            delay = IDLE if delay is None else min(max(float(delay), 0.0), IDLE)
            if delay > 0:
                try:
                    await asyncio.wait_for(wakeup.wait(), delay)
                except asyncio.TimeoutError:
                    pass

    def _wake(self, name: str) -> None:
        loop, wakeup = self._loop, self._wakeups.get(name)
        if loop is None or wakeup is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(wakeup.set)
        except RuntimeError:  # the loop is shutting down
            pass


def silence_targets(alertmanagers: list[AlertmanagerSink]) -> list[SilenceTarget]:
    """One silence target per configured Alertmanager that takes silences, with all its replicas
    (they share their spec, so any replica's client carries the right credentials)."""
    groups: dict[str, list[AlertmanagerSink]] = {}
    for sink in alertmanagers:
        if sink.spec.silences:
            groups.setdefault(sink.group, []).append(sink)
    return [
        SilenceTarget(name, members[0].url, members[0].client, urls=tuple(m.url for m in members))
        for name, members in groups.items()
    ]
