"""Process trees: the table read from this machine's /proc with real forked children, the walks over it
(bounded, nearest first, skipping another instance's process), a bounded read of a huge command line,
`cgroup.procs`, and how an instance's memory is made of its processes' figures."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.core.errors import ProbeError
from agent.core.records import ProcessIdentity
from agent.detect.model import RSS, TREE_MEMORY, InstanceSeries
from agent.watch.tree import CgroupOwnership, ProcessTree
from probes.linux.cgroupfiles import parse_cgroup_procs
from probes.linux.procfs import process_identity
from probes.linux.proctree import TreeEntry, build_table, describe, read_process_table
from support.procs import PYTHON, REPO, wait_ready

FORKER = str(REPO / "tests" / "support" / "forker.py")
MiB = 2**20


def test_the_table_of_this_machine_finds_real_children_nearest_first_bounded_and_skipped(spawn):
    server = spawn([PYTHON, FORKER, "--children", "3", "table"], stdout=subprocess.PIPE, text=True)
    children = [int(word) for word in wait_ready(server, timeout=30)[2:]]
    table = read_process_table()
    found, beyond = table.descendants(server.pid, 10)
    assert [e.pid for e in found] == sorted(children) and beyond == 0
    assert [e.identity for e in found] == [process_identity(pid) for pid in sorted(children)]
    assert table.ancestors(children[0])[0] == server.pid
    found, beyond = table.descendants(server.pid, 2)
    assert len(found) == 2 and beyond == 1
    found, _ = table.descendants(server.pid, 10, skip=[children[1]])
    assert children[1] not in [e.pid for e in found]
    assert table.alive(process_identity(server.pid))
    assert not table.alive(ProcessIdentity(server.pid, 1.0))  # same pid, another start time: not it


def test_a_huge_command_line_is_read_in_one_bounded_read(spawn):
    huge = ["x" * 120_000] * 6  # 720 KB written by the process itself
    proc = spawn([PYTHON, "-c", "import sys; print('ready', flush=True); sys.stdin.read()", *huge],
                 stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)  # fmt: skip
    wait_ready(proc)
    text = describe(proc.pid)
    assert len(text) == 160 and text.startswith(PYTHON) and text.endswith("…")
    assert describe(2**22 + 1, "gone") == "[gone]"


@st.composite
def forests(draw):
    count = draw(st.integers(1, 60))
    parents = [draw(st.integers(0, pid)) for pid in range(1, count + 1)]  # pid i's parent is below it
    return [TreeEntry(pid, parent, float(pid), "p") for pid, parent in enumerate(parents, start=1)]


def reachable(entries: list[TreeEntry], root: int) -> set[int]:
    below, grew = set(), True
    while grew:
        grew = False
        for entry in entries:
            if (entry.ppid == root or entry.ppid in below) and entry.pid not in below and entry.pid != root:
                below.add(entry.pid)
                grew = True
    return below


@given(forests(), st.integers(1, 60), st.integers(1, 20))
def test_descendants_are_bounded_complete_and_nearest_first(entries, root, limit):
    table = build_table(entries)
    found, beyond = table.descendants(root, limit)
    everything = reachable(entries, root)
    assert len(found) == min(limit, len(everything)) and len(found) + beyond == len(everything)
    assert {e.pid for e in found} <= everything
    depth = {e.pid: len(table.ancestors(e.pid)) for e in found}
    assert [depth[e.pid] for e in found] == sorted(depth[e.pid] for e in found)


@given(st.lists(st.integers(1, 2**22), max_size=50))
def test_cgroup_procs_round_trip(pids):
    assert parse_cgroup_procs("".join(f"{pid}\n" for pid in pids).encode()) == pids


@given(
    st.binary(max_size=40).filter(lambda b: any(not (c in b" \t\n\r\x0b\x0c" or 48 <= c <= 57) for c in b))
)
def test_malformed_cgroup_procs_is_a_probe_error(data):
    with pytest.raises(ProbeError):
        parse_cgroup_procs(data)


def tree_of(*rss: float) -> ProcessTree:
    tree = ProcessTree()
    tree.reset(ProcessIdentity(100, 1.0), "server", 0.0)
    tree.update(
        [(ProcessIdentity(100 + i, 2.0), 100, f"w{i}") for i in range(1, len(rss))], 0.0, lambda item: item
    )
    return tree


def test_who_is_in_a_cgroup_is_read_once_a_tick_for_every_instance_in_it(tmp_path):
    files = {
        "proc/self/mountinfo": "1 0 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        "proc/7/cgroup": "0::/app\n",
        "proc/8/cgroup": "0::/app\n",
        "sys/fs/cgroup/cgroup.controllers": "memory cpu\n",
        "sys/fs/cgroup/app/cgroup.controllers": "memory\n",
        "sys/fs/cgroup/app/cgroup.procs": "7\n",
    }
    for relative, content in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(content)
    server, other = ProcessIdentity(7, 1.0), ProcessIdentity(8, 1.0)
    ownership = CgroupOwnership(tmp_path)
    assert ownership.owns(server, [server], 10.0)
    (tmp_path / "sys/fs/cgroup/app/cgroup.procs").write_text("7\n8\n")
    assert ownership.owns(server, [server], 10.0)  # the tick's reading
    assert not ownership.owns(other, [other], 10.0)  # another instance in the cgroup, the same reading
    assert not ownership.owns(server, [server], 11.0)  # the next tick reads it again
    assert ownership.owns(server, [server, other], 11.0)


def figures(tree: ProcessTree, *rss: float) -> dict:
    ids = sorted(tree.members, key=lambda i: i.pid)
    return {identity: {"rss_bytes": value} for identity, value in zip(ids, rss, strict=False)}


def test_one_process_is_its_rss_and_a_tree_counts_shared_pages_once():
    alone = tree_of(50 * MiB)
    alone.observe(10.0, figures(alone, 50 * MiB))
    samples = {s.metric: s.value for s in alone.samples("a", 10.0, None)}
    assert samples["tree_memory_bytes"] == 50 * MiB and alone.source == "rss"

    tree = tree_of(0, 0, 0)
    tree.observe(10.0, figures(tree, 300 * MiB, 310 * MiB, 305 * MiB))
    ids = sorted(tree.members, key=lambda i: i.pid)
    # each shares 250 MiB copy-on-write with the others: PSS says so
    tree.observe(
        10.0,
        {
            i: {"pss_bytes": rss - 250 * MiB * 2 / 3}
            for i, rss in zip(ids, (300 * MiB, 310 * MiB, 305 * MiB), strict=True)
        },
    )
    tree.observe(20.0, figures(tree, 300 * MiB, 340 * MiB, 305 * MiB))  # one worker grew 30 MiB since
    samples = {s.metric: s.value for s in tree.samples("a", 20.0, None)}
    assert samples["tree_rss_bytes"] == 945 * MiB
    assert samples["tree_memory_bytes"] == pytest.approx(945 * MiB - 500 * MiB)
    assert tree.source == "pss" and samples["tree_processes"] == 3


def test_a_member_without_figures_this_tick_means_no_instance_memory_this_tick():
    tree = tree_of(0, 0)
    tree.observe(10.0, figures(tree, 100 * MiB))  # the worker could not be read
    samples = {s.metric for s in tree.samples("a", 10.0, None)}
    assert samples == {"tree_processes"}  # a partial sum would read as a drop: nothing to judge
    samples = {s.metric: s.value for s in tree.samples("a", 10.0, 123.0)}
    assert samples["tree_memory_bytes"] == 123.0 and tree.source == "cgroup"  # the cgroup's needs none


def test_the_cause_is_the_member_that_grows():
    tree = tree_of(0, 0, 0)
    for t in range(60):
        tree.observe(float(10 + t), figures(tree, 100 * MiB, 100 * MiB + t * MiB, 90 * MiB + (t % 3) * MiB))
    cause = tree.cause(0.0, 70.0)
    assert cause is not None and cause["pid"] == 101 and cause["role"] == "worker"
    assert 40 * MiB < cause["growth_bytes"] < 60 * MiB and cause["share"] > 0.9
    flat = tree_of(0)
    for t in range(10):
        flat.observe(float(t), figures(flat, 100 * MiB))
    assert flat.cause(0.0, 10.0) is None


def test_an_instance_judged_by_its_tree_keeps_the_process_rss_stored_before_the_tree_was_measured():
    """History an earlier agent stored (process RSS only) stays the instance's memory before the first
    tree sample: its earlier lifetimes and daily profile are learned from it after an upgrade."""
    own = [(float(t), 100.0) for t in range(10)]
    tree = [(float(t), 150.0) for t in range(6, 12)]
    series = InstanceSeries("web", {RSS: own, TREE_MEMORY: tree})
    assert series.series[RSS] == own[:6] + tree
    assert InstanceSeries("web", {RSS: own, TREE_MEMORY: []}).series[RSS] == own
    assert InstanceSeries("web", {TREE_MEMORY: tree}).series[RSS] == tree
