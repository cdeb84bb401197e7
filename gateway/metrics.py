"""GET /metrics in Prometheus' text format (0.0.4), written here: a handful of counters and
one gauge do not need prometheus_client."""

from __future__ import annotations

from collections import Counter

from gateway.loop_lag import LoopLag

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """The gateway's counters (one object per app); `lag`: its event loop's (LoopLag)."""

    def __init__(self, lag: LoopLag | None = None) -> None:
        self.lag = lag or LoopLag()
        self.connections = 0  # open WebSockets
        self.sessions = 0  # admitted sessions (the capacity's)
        self.capacity = 0
        self.accepted = 0
        self.refusals: Counter[str] = Counter()  # by error code
        self.turns: Counter[str] = Counter()  # ended turns by outcome

    def refused(self, code: str) -> None:
        self.refusals[code] += 1

    def render(self) -> str:
        lines = [
            "# HELP avatar_gateway_connections Open WebSocket connections.",
            "# TYPE avatar_gateway_connections gauge",
            f"avatar_gateway_connections {self.connections}",
            "# HELP avatar_gateway_connections_accepted_total WebSocket connections admitted.",
            "# TYPE avatar_gateway_connections_accepted_total counter",
            f"avatar_gateway_connections_accepted_total {self.accepted}",
            "# HELP avatar_gateway_refusals_total Refusals and errors sent, by code.",
            "# TYPE avatar_gateway_refusals_total counter",
        ]
        lines += [
            f'avatar_gateway_refusals_total{{code="{code}"}} {n}'
            for code, n in sorted(self.refusals.items())
        ]
        lines += [
            "# HELP avatar_gateway_turns_total Turns ended, by outcome.",
            "# TYPE avatar_gateway_turns_total counter",
        ]
        lines += [
            f'avatar_gateway_turns_total{{outcome="{outcome}"}} {n}'
            for outcome, n in sorted(self.turns.items())
        ]
        lines += [
            "# HELP avatar_gateway_sessions Sessions admitted (answered at once).",
            "# TYPE avatar_gateway_sessions gauge",
            f"avatar_gateway_sessions {self.sessions}",
            "# HELP avatar_gateway_capacity Sessions the gateway admits at once.",
            "# TYPE avatar_gateway_capacity gauge",
            f"avatar_gateway_capacity {self.capacity}",
            "# HELP avatar_gateway_loop_lag_seconds How late the event loop ran (recent ticks).",
            "# TYPE avatar_gateway_loop_lag_seconds summary",
        ]
        lines += [
            f'avatar_gateway_loop_lag_seconds{{quantile="{q:g}"}} {v:.6f}'
            for q, v in self.lag.quantiles().items()
        ]
        lines += [
            f"avatar_gateway_loop_lag_seconds_count {len(self.lag.lags)}",
            "# HELP avatar_gateway_loop_lag_seconds_max The largest lag since start.",
            "# TYPE avatar_gateway_loop_lag_seconds_max gauge",
            f"avatar_gateway_loop_lag_seconds_max {self.lag.max_s:.6f}",
        ]
        return "\n".join(lines) + "\n"


def parse(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value} (perf flood and tests read it back)."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values
