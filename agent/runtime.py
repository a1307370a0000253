"""The agent process: one asyncio loop running the scheduler's jobs and the HTTP server.

Start-up opens the store, launches managed commands and binds the listen socket (a clear
error if it is taken); jobs then probe, reconcile, flush and enforce retention, each with
`max_instances=1` and coalescing so that a slow run is skipped rather than stacked, and all
blocking work in threads. SIGTERM/SIGINT stop it within a few seconds, flushing the store.
In `medic run -- CMD` mode, signals are forwarded to the command and the agent exits with
its exit status when it ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

import anyio.to_thread

# apscheduler 3 ships neither inline types nor a py.typed marker, and no stubs exist for it
from apscheduler.schedulers.asyncio import AsyncIOScheduler  # type: ignore[import-untyped]
from prometheus_client import disable_created_metrics

from agent import __version__
from agent.api.app import create_app
from agent.api.auth import load_or_create_token
from agent.api.context import ApiContext
from agent.api.guard import allowed_hosts, is_loopback
from agent.api.listener import AgentServer, bind
from agent.api.metrics import Telemetry
from agent.api.server import server_config
from agent.config.model import Config
from agent.config.timescale import notes, time_axis
from agent.core.errors import ConfigError, StoreError
from agent.jobs.detection import Detection
from agent.jobs.history import TICK as HISTORY_TICK
from agent.jobs.history import HistoryJob
from agent.jobs.peers import TICK as PEERS_TICK
from agent.jobs.peers import PeersJob
from agent.jobs.remediation import Remediation
from agent.jobs.streak import SkippedRuns, quiet_skipped_runs
from agent.notify.service import Notifier
from agent.state import AGENT_FILE_NAME
from agent.state.eventlog import EventLog
from agent.state.lock import hold_state_dir
from agent.state.store import Store
from agent.watch.collector import KEEPALIVE, SAMPLES_PER_BUCKET, Collector
from agent.watch.supervisor import exit_status
from agent.watch.tracker import Tracker
from probes.base import Probe
from probes.linux.fstrust import atomic_write, ensure_private_dir
from probes.registry import PROBES, create_probe

log = logging.getLogger("medic.runtime")


class AgentInfo(TypedDict):
    """`state_dir/agent.json`: where the running agent listens, as the CLI and supervisors read it."""

    pid: int
    url: str
    version: str
    started: float


API_THREADS = 8  # worker threads of the API's blocking routes (SQLite reads), at most


class Agent:
    def __init__(
        self,
        config: Config,
        *,
        main_instance: str | None = None,
        config_path: str | None = None,
        on_listening: Callable[[AgentInfo], None] | None = None,
    ) -> None:
        self.config = config
        self.on_listening = on_listening  # called with agent.json's content once the socket is bound
        self.main_instance = main_instance
        self.config_path = config_path
        self._stop = asyncio.Event()
        self._signals = 0
        self.exit_code = 0
        self.address: tuple[str, int] | None = None

    def _probes(self) -> list[Probe]:
        enabled = {name: entry.default_enabled for name, entry in PROBES.items()}
        for name, on in self.config.agent.probes.items():
            if name not in PROBES:
                raise ConfigError(
                    f"agent.probes.{name}: unknown probe; known probes: {', '.join(sorted(PROBES))}"
                )
            enabled[name] = on
        return [create_probe(name) for name, on in enabled.items() if on]

    async def run(self) -> int:
        cfg = self.config.agent
        probes = self._probes()
        ensure_private_dir(cfg.state_dir, "agent.state_dir")  # refused before anything is written there
        with hold_state_dir(cfg.state_dir):  # a second agent on this state_dir is refused here
            return await self._run_holding_state_dir(probes)

    async def _run_holding_state_dir(self, probes: list[Probe]) -> int:
        cfg = self.config.agent
        self.store = Store(cfg.state_dir, raw_retention=cfg.raw_retention)
        token, token_path = load_or_create_token(cfg.token_file, Path(cfg.state_dir))
        log.info("admin token for mutating endpoints: %s", token_path)
        self.events = EventLog(self.store)
        self.tracker = Tracker(
            self.config.instances,
            self.store,
            self.events,
            inherit_output=[self.main_instance] if self.main_instance else [],
        )
        # no `_created` series; a process-wide switch, so set by the agent (prometheus_client leaves
        # this function unannotated)
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.agent_name = cfg.agent_name()  # the `agent` label of its alerts and of medic_build_info
        self.telemetry = Telemetry(
            self.tracker,
            agent=self.agent_name,
            fleet_label=self.config.notify.fleet_label,
            max_age=cfg.interval,
        )
        self.notifier = self._start_notifier()  # events → Alertmanager/webhook/Slack (agent/notify)
        axis = time_axis(self.config)  # every duration medic judges or waits by, on agent.time_scale
        for note in notes(self.config):
            log.info("agent.time_scale %g: %s", axis.scale.factor, note)
        memory_params = axis.memory
        # a flat series must still fill every detection bucket, or the detectors see no data and a
        # finding about a leak that stopped would never clear (it matters only for short windows);
        # and it is stored again before the slow detector would read it as stale
        self.collector = Collector(
            self.tracker,
            self.store,
            self.events,
            probes,
            self.telemetry.observe_probe,
            keepalive=max(
                0.0,
                min(KEEPALIVE, memory_params.bucket / SAMPLES_PER_BUCKET, axis.slow.stale - 2 * cfg.interval),
            ),
        )
        self.detection = Detection(
            self.tracker,
            self.store,
            self.events,
            memory_params,
            axis.slow,
            workload_label=self.config.detect.workload_label,
            scale=axis.scale,
        )
        self.telemetry.watch_findings(self.detection)
        history = self.config.history.prometheus  # the workloads' past, for new processes
        self.history = (
            HistoryJob(
                history, self.events, memory_params, self.detection.priors, self.config.detect.workload_label
            )
            if history is not None
            else None
        )
        self.remediation = Remediation(
            axis.remediation, self.tracker, self.store, self.events, self.detection
        )
        engine = self.remediation.engine  # the fleet's profiles travel through its coordinator
        self.peers = (
            PeersJob(engine.coordinator, self.detection, self.events, engine.agent_id)
            if self.config.remediation.mode != "off"
            else None
        )
        sock = bind(cfg.host, cfg.port)
        self.address = sock.getsockname()[:2]
        self._write_pidfile()
        if not is_loopback(self.address[0]):
            self.events.emit(  # logged at WARNING too
                "api_exposed",
                f"the API listens on {self.address[0]}:{self.address[1]}, reachable from other hosts: "
                "anyone there can read it (mutations need the admin token); keep agent.listen on "
                "127.0.0.1 unless a proxy or firewall guards the port",
                severity="warning",
                listen=f"{self.address[0]}:{self.address[1]}",
            )
        self.events.emit(
            "agent_started",
            f"medic {__version__} watching {len(self.config.instances)} instance spec(s), "
            f"API on http://{self.address[0]}:{self.address[1]}",
            version=__version__,
            listen=f"{self.address[0]}:{self.address[1]}",
            probes=[p.name for p in probes],
        )
        self._loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self._on_signal, sig)
        scheduler: AsyncIOScheduler | None = None
        server: AgentServer | None = None
        serving: asyncio.Task[None] | None = None
        try:  # from here on, whatever happens, managed children are stopped and the store flushed
            await asyncio.to_thread(self._first_pass)
            scheduler = self._schedule()
            context = ApiContext(
                self.tracker,
                self.store,
                self.telemetry,
                self.events,
                token,
                detection=self.detection,
                remediation=self.remediation,
                config_path=self.config_path,
                notify=self.config.notify,
                allowed_hosts=allowed_hosts(cfg.host, cfg.allowed_hosts),
                max_body=cfg.http.max_body,
                time_scale=self.config.agent.time_scale,
                agent_name=self.agent_name,
            )
            # FastAPI asks, for every route parameter, whether it is a pydantic.v1 model by importing
            # pydantic.v1 (0.9 MiB of RSS kept for the agent's life); medic has none, so in the agent's
            # own process the module is marked absent and the check answers "no" at once
            # (None in sys.modules is the import system's "absent" marker, which typeshed does not model)
            sys.modules.setdefault("pydantic.v1", None)  # type: ignore[arg-type]
            app = create_app(context)
            server = AgentServer(
                server_config(
                    app,
                    header_timeout=cfg.http.header_timeout,
                    keep_alive=cfg.http.keep_alive,
                    max_connections=cfg.http.max_connections,
                )
            )
            # the API's plain `def` routes run in anyio's worker threads, 40 by default: each thread a
            # clients' burst starts keeps its stack and its share of the heap's high-water mark
            anyio.to_thread.current_default_thread_limiter().total_tokens = API_THREADS
            serving = asyncio.create_task(server.serve(sockets=[sock]))
            scheduler.start()
            await self._stop.wait()
        finally:
            await self._shutdown(scheduler, server, serving)
        return self.exit_code

    def _start_notifier(self) -> Notifier:
        """The notifier from the parts it needs, subscribed to the event log, its workers started."""

        def labels_for(name: str) -> dict[str, str]:
            state = self.tracker.get(name)
            return dict(state.labels) if state is not None else {}

        notifier = Notifier(
            self.config.notify,
            self.store,
            self.events,
            labels_for=labels_for,
            agent=self.agent_name,
            external_url=self.config.agent.external_url,
        )
        self.telemetry.registry.register(notifier.collector)
        self.events.subscribe(notifier.wake)
        notifier.start()
        return notifier

    @property
    def pidfile(self) -> Path:
        return Path(self.config.agent.state_dir) / AGENT_FILE_NAME

    def _write_pidfile(self) -> None:
        """`state_dir/agent.json`: where this agent listens, for the CLI, tests and supervisors."""
        host, port = self.address or ("", 0)
        info: AgentInfo = {
            "pid": os.getpid(),
            "url": f"http://{host}:{port}",
            "version": __version__,
            "started": time.time(),
        }
        try:
            atomic_write(self.pidfile, json.dumps(info).encode(), 0o600)  # a fresh O_EXCL name, renamed
        except OSError as exc:
            raise StoreError(
                f"cannot write {self.pidfile}: {exc.strerror or exc}; free space in agent.state_dir "
                "or point it at a writable directory"
            ) from None
        if self.on_listening is not None:
            self.on_listening(info)

    def _first_pass(self) -> None:
        now = time.time()
        self.tracker.launch_managed(now)
        self.tracker.reconcile(now, scan=True)
        self._say_what_is_not_found()
        self.collector.run("fast", now)
        self.collector.run("slow", now)

    def _say_what_is_not_found(self) -> None:
        """One line per instance with no process at start: waiting is what medic does then, but
        silently it looks like a hang."""
        for state in list(self.tracker.states.values()):
            if state.status != "waiting":
                continue
            match = state.spec.match
            how = next(
                (
                    f"{key} {getattr(match, key)}"
                    for key in ("pid", "pidfile", "cmdline")
                    if getattr(match, key)
                ),
                "its matcher",
            )
            log.warning(
                "%s: no process found by %s (%s); medic keeps looking (`medic status` shows it once found)",
                state.name,
                how,
                state.status_reason,
            )

    def _schedule(self) -> AsyncIOScheduler:
        cfg = self.config.agent
        scheduler = AsyncIOScheduler(
            job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": None}
        )

        def job(fn: Callable[[], object], seconds: float, name: str, shown: bool = True) -> None:
            """`shown`: what the job changes shows on /metrics, so the page is built anew after it."""

            async def run() -> None:
                try:
                    await asyncio.to_thread(fn)
                except asyncio.CancelledError:  # the scheduler's shutdown: the agent is stopping
                    log.debug("job %s cancelled: the agent is stopping", name)
                    return
                except StoreError as exc:
                    log.error("%s: %s", name, exc)
                except Exception:
                    log.exception("job %s failed; it runs again on its next tick", name)
                if shown:
                    self.telemetry.changed()

            scheduler.add_job(
                run, "interval", seconds=seconds, id=name, name=name, jitter=min(seconds * 0.05, 1.0)
            )

        job(self._fast_tick, cfg.interval, "probe-fast")
        job(lambda: self.collector.run("slow"), cfg.slow_interval, "probe-slow")
        job(lambda: self.tracker.reconcile(scan=True), cfg.discovery_interval, "discovery")
        job(self.store.flush, cfg.flush_interval, "flush", shown=False)
        job(self._retention, min(3600.0, cfg.raw_retention / 4), "retention", shown=False)
        job(self._refresh_limits, cfg.slow_interval, "memory-limits")
        job(self.detection.run, self.config.detect.interval, "detect")
        if self.history is not None:
            job(self.history.tick, HISTORY_TICK, "history")
        if self.peers is not None:
            job(self.peers.tick, PEERS_TICK, "peers")
        job(self.remediation.step, self.config.remediation.interval, "remediate")
        quiet_skipped_runs(scheduler, SkippedRuns(self.telemetry.count_skipped_run, log))
        return scheduler

    def _fast_tick(self) -> None:
        now = time.time()
        self.tracker.reconcile(now)
        self.collector.run("fast", now)
        if self.main_instance:
            state = self.tracker.get(self.main_instance)
            if state is not None and state.status == "exited":
                self.exit_code = state.exit_code or 0
                self._request_stop()

    def _refresh_limits(self) -> None:
        with self.tracker.lock:
            for state in self.tracker.states.values():
                if state.status == "up":
                    self.tracker.resolve_memory_limit(state)

    def _retention(self) -> None:
        cfg = self.config.agent
        deleted = self.store.enforce_retention(time.time(), cfg.raw_retention, cfg.rollup_retention)
        if any(deleted.values()):
            log.info("retention: deleted %s", deleted)

    def _request_stop(self) -> None:
        """Stop the agent from a worker thread."""
        self._loop.call_soon_threadsafe(self._stop.set)

    def _on_signal(self, sig: int) -> None:
        self._signals += 1
        name = signal.Signals(sig).name
        managed = self.tracker.managed.get(self.main_instance) if self.main_instance else None
        if managed is not None and managed.pid is not None:
            forwarded = signal.SIGKILL if self._signals > 1 else sig
            log.info(
                "forwarding %s to %s (pid %s)",
                signal.Signals(forwarded).name,
                self.main_instance,
                managed.pid,
            )
            managed.stopping = True
            managed.send(forwarded)
            return  # the tick sees it exit and stops the agent with its status
        log.info("%s received: stopping", name)
        self._stop.set()

    async def _shutdown(
        self,
        scheduler: AsyncIOScheduler | None,
        server: AgentServer | None,
        serving: asyncio.Task[None] | None,
    ) -> None:
        if scheduler is not None and scheduler.running:
            scheduler.shutdown(wait=False)
        if server is not None:
            server.should_exit = True
        await self.notifier.stop()
        if getattr(self, "remediation", None) is not None:
            await asyncio.to_thread(self.remediation.close)  # running restarts stop waiting; slots released
        results = await asyncio.to_thread(self.tracker.stop_managed)
        if self.main_instance and results.get(self.main_instance) is not None:
            self.exit_code = exit_status(results[self.main_instance])  # type: ignore[arg-type]
        if server is not None and serving is not None:
            try:
                await asyncio.wait_for(serving, timeout=2.0)
            except (asyncio.TimeoutError, Exception):
                server.force_exit = True
        self.events.emit("agent_stopped", "medic stopped", exit_code=self.exit_code)
        self.pidfile.unlink(missing_ok=True)
        try:
            self.store.close()
        except StoreError as exc:
            log.error("final flush failed: %s", exc)
