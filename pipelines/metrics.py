"""Prometheus metrics of an agent's calls, under the names LiveKit and Pipecat users know.

Each turn's report (``TurnCompleted.report``) feeds the stage histograms:

    end_of_turn_delay     stages.vad_endpoint     end of caller speech -> endpoint decision
    transcription_delay   stages.asr_final        endpoint -> final transcript
    llm_ttft              stages.llm_block        transcript -> first response block
    llm_steps             stages.llm_steps        denoising passes of that block (a count)
    tts_ttfb              stages.tts_first_audio  block -> first synthesized audio
    e2e_latency           gap_ms                  end of caller speech -> agent audio starts
    llm_tokens_per_second stages.llm_tokens_per_s reply tokens over the request's wall time
    llm_requests          llm_requests            LM calls per turn, speculative ones included (a counter)
    llm_errors            llm_error events        failed LM requests by fault (remote backend; a counter)

For the remote backend (``llm.backend: openai``) llm_ttft runs from the transcript to the
reply's first clause having streamed, and llm_steps counts the streamed chunks.

and the counters: turns, violations, speculation hits/misses, and ``reply_cache_hits`` /
``reply_cache_misses`` from ``cache.state`` (a miss: a cacheable turn not found, or found
with the backend down; turns with specifics are neither).

Latencies are in seconds, as Prometheus expects (``voice_agent_llm_ttft_seconds``). Every
metric carries the transport (replay, sip, webrtc, livekit) as a label. The metrics listen
on the bus synchronously (a histogram observe costs microseconds), so they never lag and
never drop; the drop counter reports other subscribers' drops, such as the MQTT bridge's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from pipelines.config import MetricsConfig
from pipelines.events import Event, EventBus

log = logging.getLogger(__name__)

NAMESPACE = "voice_agent"
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 0.8, 1.0, 1.5, 2.5, 5.0)
STEP_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256)
# report stage key -> histogram name
STAGE_METRICS = {
    "vad_endpoint": "end_of_turn_delay",
    "asr_final": "transcription_delay",
    "llm_block": "llm_ttft",
    "tts_first_audio": "tts_ttfb",
}


class _DropCollector(Collector):
    """Reads drop counts from their owners at scrape time (they are plain ints there)."""

    def __init__(self) -> None:
        self.sources: dict[str, Callable[[], int]] = {}

    def collect(self) -> Iterable[CounterMetricFamily]:
        fam = CounterMetricFamily(
            f"{NAMESPACE}_events_dropped",
            "Events a subscriber could not keep (bounded queue full), by subscriber",
            labels=["sink"],
        )
        for sink, fn in self.sources.items():
            try:
                fam.add_metric([sink], float(fn()))
            except Exception:  # a broken source must not break the scrape
                log.exception("metrics: drop source %s failed", sink)
        yield fam


class AgentMetrics:
    """The metrics of one agent, in their own registry (several agents may share a process)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry

        def latency(name: str, doc: str) -> Histogram:
            return Histogram(
                name, doc, ["transport"], namespace=NAMESPACE, unit="seconds", registry=r, buckets=LATENCY_BUCKETS
            )

        self.histograms: dict[str, Histogram] = {
            "end_of_turn_delay": latency("end_of_turn_delay", "End of caller speech to the endpoint decision"),
            "transcription_delay": latency("transcription_delay", "Endpoint decision to the final transcript"),
            "llm_ttft": latency("llm_ttft", "Final transcript to the first response block"),
            "tts_ttfb": latency("tts_ttfb", "First response block to the first synthesized audio"),
            "e2e_latency": latency("e2e_latency", "End of caller speech to the first agent audio (the turn gap)"),
        }
        self.llm_steps = Histogram(
            "llm_steps",
            "Denoising passes spent on the first response block",
            ["transport"],
            namespace=NAMESPACE,
            registry=r,
            buckets=STEP_BUCKETS,
        )
        self.llm_tokens_per_s = Histogram(
            "llm_tokens_per_second", "Reply tokens per second of the LM request that answered a turn", ["transport"],
            namespace=NAMESPACE, registry=r, buckets=(10, 25, 50, 100, 200, 400, 800, 1600, 3200, 6400),
        )
        self.llm_requests = Counter(
            "llm_requests", "LM calls made for turns, speculative ones included", ["transport"], namespace=NAMESPACE,
            registry=r,
        )
        self.llm_errors = Counter(
            "llm_errors", "Failed LM requests, by fault (connect, stall, deadline, rate_limit, server, http, auth, "
            "malformed, backoff)", ["transport", "error"], namespace=NAMESPACE, registry=r,
        )
        self.turns = Counter("turns", "Caller turns answered", ["transport"], namespace=NAMESPACE, registry=r)
        self.violations = Counter(
            "budget_violations",
            "Stages over their latency budget",
            ["transport", "stage"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.speculation = Counter(
            "speculations",
            "Turns answered from a speculative reply (hit) or regenerated (miss)",
            ["transport", "result"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.speculation_hit_rate = Gauge(
            "speculation_hit_rate", "Hits over speculative turns since start", namespace=NAMESPACE, registry=r
        )
        self.reply_cache_hits = Counter(
            "reply_cache_hits", "Turns answered from the reply cache (no LM, no TTS)", ["transport"],
            namespace=NAMESPACE, registry=r)
        self.reply_cache_misses = Counter(
            "reply_cache_misses", "Cacheable turns the reply cache could not answer (not found, or its backend down)",
            ["transport"], namespace=NAMESPACE, registry=r)
        self.interruptions = Counter(
            "interruptions",
            "Agent replies cut off by the caller (barge-in)",
            ["transport"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.false_interruptions = Counter(
            "false_interruptions", "Barge-ins with no words in them, after which the cut reply went on",
            ["transport"], namespace=NAMESPACE, registry=r)
        self.dtmf = Counter("dtmf_digits", "DTMF digits received", ["transport"], namespace=NAMESPACE, registry=r)
        self.sessions = Counter("sessions", "Calls started", ["transport"], namespace=NAMESPACE, registry=r)
        self.sessions_active = Gauge("sessions_active", "Calls in progress", namespace=NAMESPACE, registry=r)
        self.sessions_ended = Counter(
            "sessions_ended", "Calls ended, by why (caller_hangup, agent_hangup, transferred, rtp_timeout, ...)",
            ["transport", "reason"], namespace=NAMESPACE, registry=r)
        self._drops = _DropCollector()
        r.register(self._drops)
        self._hits = 0
        self._spec_turns = 0
        self._transport: dict[str, str] = {}
        self.speculation_hit_rate.set_function(lambda: self._hits / self._spec_turns if self._spec_turns else 0.0)

    def attach(self, bus: EventBus) -> AgentMetrics:
        bus.add_listener(self.observe)
        return self

    def track_drops(self, sink: str, count: Callable[[], int]) -> None:
        """Report ``count()`` as ``voice_agent_events_dropped_total{sink=...}``."""
        self._drops.sources[sink] = count

    def observe(self, ev: Event) -> None:
        """Bus listener: called inline for every event, so it only counts."""
        kind = ev.kind
        if kind == "session/start":
            transport = str(getattr(ev, "transport", "unknown"))
            self._transport[ev.session_id] = transport
            self.sessions.labels(transport).inc()
            self.sessions_active.inc()
            return
        transport = self._transport.get(ev.session_id, "unknown")
        if kind == "turn":
            self._turn(transport, getattr(ev, "report", {}) or {})
        elif kind == "violation":
            self.violations.labels(transport, str(getattr(ev, "stage", ""))).inc()
        elif kind == "llm_error":
            self.llm_errors.labels(transport, str(getattr(ev, "error", ""))).inc()
        elif kind == "interrupt":
            self.interruptions.labels(transport).inc()
        elif kind == "resume":
            self.false_interruptions.labels(transport).inc()
        elif kind == "dtmf":
            self.dtmf.labels(transport).inc()
        elif kind == "session/end":
            if self._transport.pop(ev.session_id, None) is not None:
                self.sessions_active.dec()
                self.sessions_ended.labels(transport, str(getattr(ev, "reason", "unknown"))).inc()

    def _turn(self, transport: str, report: dict[str, Any]) -> None:
        self.turns.labels(transport).inc()
        stages = report.get("stages") or {}
        for key, name in STAGE_METRICS.items():
            ms = _number(stages.get(key))
            if ms is not None:
                self.histograms[name].labels(transport).observe(ms / 1000.0)
        steps = _number(stages.get("llm_steps"))
        if steps is not None:
            self.llm_steps.labels(transport).observe(steps)
        tps = _number(stages.get("llm_tokens_per_s"))
        if tps is not None:
            self.llm_tokens_per_s.labels(transport).observe(tps)
        requests = _number(report.get("llm_requests"))
        if requests:
            self.llm_requests.labels(transport).inc(requests)
        gap = _number(report.get("gap_ms"))
        if gap is not None:
            self.histograms["e2e_latency"].labels(transport).observe(gap / 1000.0)
        spec = report.get("speculation") or {}
        if spec.get("used"):
            hit = bool(spec.get("hit"))
            self._spec_turns += 1
            self._hits += hit
            self.speculation.labels(transport, "hit" if hit else "miss").inc()
        cache = (report.get("cache") or {}).get("state")
        if cache == "hit":
            self.reply_cache_hits.labels(transport).inc()
        elif cache in ("miss", "unavailable"):
            self.reply_cache_misses.labels(transport).inc()


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x)


class MetricsServer:
    """``/metrics`` over HTTP in a daemon thread (prometheus-client's own server)."""

    def __init__(self, metrics: AgentMetrics, port: int, host: str = "127.0.0.1") -> None:
        self.metrics = metrics
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=metrics.registry)
        except OSError as exc:
            raise OSError(f"metrics: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self.host = host
        self.port = int(self._server.server_port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(2)


def start_metrics_server(
    agent: Any, port: int, host: str = "127.0.0.1", drop_sources: dict[str, Callable[[], int]] | None = None
) -> MetricsServer:
    """Count ``agent``'s events and serve them on ``http://host:port/metrics`` (port 0: any free one).

    ``drop_sources`` maps a subscriber name to a function returning its drop count, for
    example ``{"mqtt": lambda: bridge.dropped}``.
    """
    metrics = AgentMetrics().attach(agent.bus)
    for sink, fn in (drop_sources or {}).items():
        metrics.track_drops(sink, fn)
    server = MetricsServer(metrics, port, host)
    log.info("metrics: serving %s", server.url)
    return server


def start_metrics(
    agent: Any, cfg: MetricsConfig, drop_sources: dict[str, Callable[[], int]] | None = None
) -> MetricsServer | None:
    """For servers: ``/metrics`` on ``cfg.prometheus_port``, or None when that is not set."""
    if cfg.prometheus_port is None:
        return None
    return start_metrics_server(agent, cfg.prometheus_port, cfg.prometheus_host, drop_sources)
