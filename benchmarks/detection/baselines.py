"""The two alerting rules medic is compared with, evaluated on a trace like Prometheus would.

- `predict_linear`: `predict_linear(rss[1h], 4*3600) > limit` with `for: 10m`, evaluated
  every minute: least squares over the samples of the last hour, extrapolated 4 h from now.
- `monit`: `if memory > 90 % of the limit for 5 cycles then alert`, one cycle a minute.

Both return the times at which the alert starts firing (a rule that stops and fires again
counts twice); times are production seconds.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

MINUTE = 60.0


def predict_linear_alert(
    points: list[tuple[float, float]],
    limit: float,
    range_s: float = 3600.0,
    ahead: float = 4 * 3600.0,
    for_s: float = 600.0,
    every: float = MINUTE,
) -> list[float]:
    times = [t for t, _ in points]
    values = [v for _, v in points]
    alerts: list[float] = []
    if not times:
        return alerts
    # prefix sums for O(1) least squares over any window (times shifted for precision)
    origin = times[0]
    st = [0.0]
    sv = [0.0]
    stt = [0.0]
    stv = [0.0]
    for t, v in zip(times, values, strict=True):
        x = t - origin
        st.append(st[-1] + x)
        sv.append(sv[-1] + v)
        stt.append(stt[-1] + x * x)
        stv.append(stv[-1] + x * v)
    pending_since = None
    active = False
    now = times[0] + every
    while now <= times[-1]:
        j = bisect_right(times, now)
        i = bisect_left(times, now - range_s)
        n = j - i
        firing = False
        if n >= 2:
            sx, sy = st[j] - st[i], sv[j] - sv[i]
            sxx, sxy = stt[j] - stt[i], stv[j] - stv[i]
            denom = n * sxx - sx * sx
            if denom > 0:
                slope = (n * sxy - sx * sy) / denom
                intercept = (sy - slope * sx) / n
                predicted = intercept + slope * (now - origin + ahead)
                firing = predicted > limit
        if firing:
            if pending_since is None:
                pending_since = now
            if not active and now - pending_since >= for_s:
                active = True
                alerts.append(now)
        else:
            pending_since, active = None, False
        now += every
    return alerts


def monit_alert(
    points: list[tuple[float, float]], limit: float, fraction: float = 0.9, cycles: int = 5
) -> list[float]:
    """Times the memory has stayed above `fraction` of the limit for `cycles` consecutive samples."""
    threshold = fraction * limit
    alerts: list[float] = []
    run = 0
    for ts, value in points:
        run = run + 1 if value > threshold else 0
        if run == cycles:
            alerts.append(ts)
    return alerts
