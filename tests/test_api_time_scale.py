"""The API says how compressed the detection clock is, so the dashboard can say it plainly."""

from __future__ import annotations

import subprocess

import pytest

from support.http_guard import World


@pytest.mark.parametrize("scale", [1.0, 360.0])
def test_instances_and_healthz_carry_the_time_scale(tmp_path, spawn, scale: float) -> None:
    child = spawn(["sleep", "60"], stdout=subprocess.DEVNULL)
    world = World(tmp_path, child.pid, time_scale=scale)
    try:
        listing = world.request("GET", "/api/v1/instances")
        assert listing.status_code == 200 and listing.json()["time_scale"] == scale
        assert world.request("GET", "/healthz").json()["time_scale"] == scale
    finally:
        world.close()
