"""What holds a Python leak, through a real agent and real hooked services (`support.pyleaks`):

- a module-level dict of bytes keyed by ints, and a module-level list of str, each get a suspect that
  names the container (`cache_service.CACHE`) and the line that fills it; the bounded twin (an LRU of
  the same entries) gets no finding and no suspect;
- a leak held only by a running function's local dict, which the type view cannot explain: the agent
  asks for allocation sites before the finding opens, says on the finding what it collects, and a
  site suspect names the line;
- a registry leak (closures subscribed to a module-level bus) names the registering line
  (`BUS.subscribe(...)`) as what adds to the holder; a numpy-list leak names the list and its append.
"""

from __future__ import annotations

import pytest

from support.compressed import DETECT, FAST
from support.procs import wait_until
from support.pyleaks import command, line, write_services

pytestmark = pytest.mark.slow
MiB = 2**20
PYTHON_HISTOGRAMS = {"python": {"interval": "1s", "sites": {"interval": "1s", "frames": 5}}}


def service(tmp_path, sock_dir: str, name: str, module: str, mode: str, limit: int, rate: int = 64) -> dict:
    """An instance running `module` in `mode`: `rate` requests a second of 24 KiB (about 1.5 MiB/s)."""
    template = f"{sock_dir}/{name}.%p.sock"
    return {
        "name": name,
        "match": {
            "command": command(tmp_path, module, mode, 24 * 1024, rate),
            "env": {"MEDIC_HOOK_SOCKET": template},
        },
        "hook": {"socket": template},
        "memory_limit": limit,
        "histograms": PYTHON_HISTOGRAMS,
    }


def start(agent, tmp_path, *instances: dict) -> None:
    """Write the services into `tmp_path` and start the agent on `instances` of them."""
    write_services(tmp_path)
    agent.start({"agent": FAST, "detect": DETECT, "instances": list(instances)})


def leak_of(agent, instance: str) -> dict | None:
    leaks = [f for f in agent.get("/api/v1/findings", kind="leak")["findings"] if f["instance"] == instance]
    return leaks[0] if leaks else None


def holding(finding: dict | None, holder: str, added_at: str) -> dict | None:
    """The suspect of `finding` that names `holder` and the line that adds to it: the container itself
    (filled at the line), or a site it holds (held by it, added at the line)."""
    for suspect in (finding or {}).get("evidence", {}).get("suspects") or []:
        held = (suspect.get("held_by") or [{}])[0]
        if suspect["name"] == holder and suspect.get("added_at") == added_at:
            return suspect
        if held.get("name") == holder and held.get("added_at") == added_at:
            return suspect
    return None


def test_a_module_dict_of_bytes_and_a_list_of_str_are_named_with_their_line_and_the_lru_is_not(
    agent, tmp_path, sock_dir
):
    source = tmp_path / "cache_service.py"
    start(
        agent,
        tmp_path,
        service(tmp_path, sock_dir, "responses", "cache_service", "dict", 200 * MiB),
        service(tmp_path, sock_dir, "lines", "cache_service", "list", 200 * MiB),
        service(tmp_path, sock_dir, "recent", "cache_service", "lru", 200 * MiB),
    )
    fills = line(source, "fills the cache")
    found = wait_until(lambda: holding(leak_of(agent, "responses"), "cache_service.CACHE", fills), 150, 1.0)
    assert found["bytes_per_second"] > 0.5 * MiB, found
    container = found if found["kind"] == "container" else None
    if container is not None:
        assert container["detail"] == "dict int -> bytes", container

    appends = line(source, "appends the line")
    found = wait_until(lambda: holding(leak_of(agent, "lines"), "cache_service.NAMES", appends), 150, 1.0)
    assert found["bytes_per_second"] > 0.5 * MiB, found

    assert leak_of(agent, "recent") is None
    suspects = agent.get("/api/v1/instances/recent/suspects", since="5m")["suspects"]
    assert not [s for s in suspects if "RECENT" in s["name"] or "RECENT" in str(s.get("held_by"))], suspects
    latest = agent.get("/api/v1/instances/recent/histograms", kind="container", top=50)["latest"]["container"]
    assert any(row["name"] == "cache_service.RECENT" and row["count"] <= 65 for row in latest["rows"]), latest


def test_a_leak_the_type_view_cannot_see_is_named_by_its_site_and_the_finding_says_what_it_collects(
    agent, tmp_path, sock_dir
):
    """A leak this close to its limit opens at once (critical): the collector starts the sites then;
    the detection job's earlier request, for a pending finding, is tested in test_pysuspects.py."""
    start(agent, tmp_path, service(tmp_path, sock_dir, "hidden", "cache_service", "local", 200 * MiB))
    keeps = line(tmp_path / "cache_service.py", "keeps it locally")

    def named() -> dict | None:
        finding = leak_of(agent, "hidden")
        suspects = (finding or {}).get("evidence", {}).get("suspects") or []
        return finding if any(s["name"] == keeps for s in suspects) else None

    finding = wait_until(named, 150, 1.0)
    assert finding["evidence"]["suspects"][0]["name"] == keeps, finding["evidence"]["suspects"]
    events = agent.events()
    assert [e for e in events if e["kind"] == "sites_started" and e["instance"] == "hidden"]
    said = [
        e["data"]["finding"]["evidence"].get("collecting")
        for e in events
        if e["kind"] in ("finding_opened", "finding_updated") and e["instance"] == "hidden"
    ]
    said += [f["evidence"].get("collecting") for f in agent.get("/api/v1/findings", state="all")["findings"]]
    assert any(c and c["what"] == "allocation sites (tracemalloc)" and c["message"] for c in said), said


def test_a_registry_leak_names_the_registering_line_and_a_numpy_list_its_append(agent, tmp_path, sock_dir):
    start(
        agent,
        tmp_path,
        service(tmp_path, sock_dir, "events", "events_service", "bus", 200 * MiB),
        service(tmp_path, sock_dir, "batches", "numpy_service", "list", 260 * MiB),
    )
    registers = line(tmp_path / "events_service.py", "registers")
    holder = "events_service.BUS._subscribers"

    def held() -> dict | None:  # the payload's site, held by the bus's list, added by the registering line
        found = holding(leak_of(agent, "events"), holder, registers)
        return found if found and found["kind"] == "site" else None

    found = wait_until(held, 150, 1.0)
    assert found["name"] == line(tmp_path / "events_service.py", "the payload"), found
    assert found["bytes_per_second"] > 0.5 * MiB and found["held_by"][0]["holds"] == "function", found

    appends = line(tmp_path / "numpy_service.py", "appends the batch")
    found = wait_until(lambda: holding(leak_of(agent, "batches"), "numpy_service.ARRAYS", appends), 150, 1.0)
    assert found["bytes_per_second"] > 0.5 * MiB, found
