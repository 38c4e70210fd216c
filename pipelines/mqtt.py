"""Call events out to an MQTT broker, and control messages back in.

Topics, under ``{prefix}/{agent_id}``:

    status                                  retained {"state": "online"|"offline"}; the last will says offline
    {session_id}/{event type}               one JSON event (session/start, turn, partial, dtmf, ...)
    {session_id}/control/{command}          in: say | hangup | transfer | mute | unmute | config/budgets
    {session_id}/reply                      out: {"ok": ..., "error": ...} for every control message

The broker must never be able to hurt a call. Events leave the bus through a subscriber
queue into a bounded outbox; a background task publishes them with QoS 1 and removes one
only once the broker has acknowledged it, so a broker that is absent or dies mid-call just
means the outbox fills while the bridge reconnects with backoff. Only when the outbox holds
``queue_max`` events does the oldest one go, and every such drop is counted. Delivery is
at least once: an event in flight when the connection breaks is sent again, so consumers
dedupe on ``seq``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import re
import ssl
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import aiomqtt

from pipelines.config import TRANSFER_URI, ConfigError, MqttConfig
from pipelines.events import SCHEMA_VERSION, Event, EventBus, Partial
from voice.events import to_json

log = logging.getLogger(__name__)

COMMANDS = ("say", "hangup", "transfer", "mute", "unmute", "config/budgets")
MAX_CONTROL_BYTES = 64 * 1024
TRANSFER_TARGET = re.compile(TRANSFER_URI)
_WINDOW = 16  # QoS 1 publishes in flight at once (paho allows 20)
# After these a pending partial is stale: the turn's final transcript supersedes it.
_ENDS_UTTERANCE = frozenset({"endpoint", "turn", "session/end"})


class ControllableSession(Protocol):
    hangup_requested: asyncio.Event

    async def say(self, text: str) -> None: ...

    def request_transfer(self, to: str) -> None: ...

    def set_muted(self, muted: bool) -> None: ...

    def update_budgets(self, values: dict) -> None: ...


class BusOwner(Protocol):
    bus: EventBus
    sessions: dict[str, Any]


@dataclass(frozen=True)
class _Msg:
    topic: str
    payload: bytes
    retain: bool = False


class ControlError(ValueError):
    """A control message that cannot be acted on; the text goes into the reply."""


def topic_safe(name: str) -> str:
    """A session id as one topic level: no separators, no wildcards."""
    return "".join("_" if c in "/+#\0" else c for c in name) or "_"


def apply_mqtt_url(cfg: MqttConfig, url: str) -> MqttConfig:
    """``--mqtt mqtt[s]://[user[:password]@]host[:port]`` over the configured broker settings."""
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError as exc:
        raise ConfigError(f"--mqtt {url!r}: {exc}") from None
    if u.scheme not in ("mqtt", "mqtts") or not u.hostname:
        raise ConfigError(f"--mqtt {url!r}: expected mqtt://HOST[:PORT] or mqtts://HOST[:PORT]")
    tls = u.scheme == "mqtts"
    update: dict[str, Any] = {"host": u.hostname, "tls": tls, "port": port or (8883 if tls else 1883)}
    if u.username is not None:
        update["username"] = unquote(u.username)
        update["password"] = unquote(u.password) if u.password is not None else None
    try:
        return MqttConfig.model_validate({**cfg.model_dump(), **update})
    except ValueError as exc:
        raise ConfigError(f"--mqtt {url!r}: {exc}") from None


def encode(d: dict[str, Any]) -> bytes:
    return to_json(d).encode()


class MqttBridge:
    """Publishes an agent's events and applies control messages to its live sessions."""

    def __init__(self, agent: BusOwner, cfg: MqttConfig) -> None:
        if cfg.host is None:
            raise ConfigError("mqtt.host is not set")
        self.cfg = cfg
        self._agent = agent
        self.base = f"{cfg.prefix.rstrip('/')}/{cfg.agent_id}"
        self.status_topic = f"{self.base}/status"
        self._tls = self._tls_context(cfg)
        self._identifier = f"{cfg.agent_id}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._outbox: deque[_Msg] = deque()
        self._inflight: list[_Msg] = []
        self._wake = asyncio.Event()
        self._connected = asyncio.Event()
        self._client: aiomqtt.Client | None = None
        self._queue: asyncio.Queue[Event] | None = None
        self._bus_dropped = [0]
        self._tasks: list[asyncio.Task[None]] = []
        self._control_tasks: set[asyncio.Task[None]] = set()
        self._last_partial: dict[str, float] = {}
        self._pending_partial: dict[str, tuple[Partial, asyncio.TimerHandle]] = {}
        self._seq = 0
        self._closing = False
        self._closed = False
        self._outage_logged = False
        self.delivered = 0
        self.dropped_full = 0
        self.partials_suppressed = 0
        self.connects = 0
        self.control_ok = 0
        self.control_errors = 0
        self.encode_errors = 0

    @staticmethod
    def _tls_context(cfg: MqttConfig) -> ssl.SSLContext | None:
        if not cfg.tls:
            return None
        try:
            return ssl.create_default_context(cafile=cfg.tls_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"mqtt.tls_ca: cannot load {cfg.tls_ca!r}: {exc}") from None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        # The bus queue only has to absorb a burst between two pump wake-ups; the real
        # bound, the one that survives an outage, is the outbox.
        self._queue, self._bus_dropped = self._agent.bus.subscribe(maxsize=max(self.cfg.queue_max, 1000))
        self._tasks = [
            asyncio.create_task(self._pump(), name="mqtt-pump"),
            asyncio.create_task(self._connection_loop(), name="mqtt-connection"),
        ]

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def dropped(self) -> int:
        """Events that never reached the broker: outbox overflow plus bus-queue overflow."""
        return self.dropped_full + self._bus_dropped[0]

    @property
    def queued(self) -> int:
        return len(self._outbox) + len(self._inflight)

    async def wait_connected(self, within_s: float) -> bool:
        try:
            await asyncio.wait_for(self._connected.wait(), within_s)
        except TimeoutError:
            return False
        return True

    async def wait_idle(self, within_s: float) -> bool:
        """Until every event taken from the bus so far has been acknowledged by the broker."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if (self._queue is None or self._queue.empty()) and not self._outbox and not self._inflight:
                return True
            await asyncio.sleep(0.005)
        return False

    def stats(self) -> dict[str, Any]:
        return {
            "connected": self.connected,
            "delivered": self.delivered,
            "dropped": self.dropped,
            "dropped_queue_full": self.dropped_full,
            "dropped_bus": self._bus_dropped[0],
            "queued": self.queued,
            "partials_suppressed": self.partials_suppressed,
            "connects": self.connects,
            "control_ok": self.control_ok,
            "control_errors": self.control_errors,
            "encode_errors": self.encode_errors,
        }

    async def close(self, flush_timeout: float = 2.0) -> dict[str, Any]:
        """Flush what the broker will take within ``flush_timeout``, say offline, disconnect."""
        if self._closed:
            return self.stats()
        self._closed = True
        if self._queue is not None:
            self._agent.bus.unsubscribe(self._queue)
            for t in self._tasks[:1]:  # the pump: drain what it has not taken yet, here
                t.cancel()
            while not self._queue.empty():
                self._accept(self._queue.get_nowait())
        for _, handle in self._pending_partial.values():
            handle.cancel()
            self.partials_suppressed += 1
        self._pending_partial.clear()
        if self.connected:
            await self.wait_idle(flush_timeout)
        client = self._client
        if client is not None and self.connected:
            try:
                await client.publish(self.status_topic, self._status("offline"), qos=1, retain=True, timeout=1.0)
            except aiomqtt.MqttError as exc:
                log.info("mqtt: could not publish offline status: %s", exc)
        self._closing = True
        for t in [*self._tasks, *self._control_tasks]:
            t.cancel()
        try:
            await asyncio.wait_for(asyncio.gather(*self._tasks, *self._control_tasks, return_exceptions=True), 5.0)
        except TimeoutError:
            log.warning("mqtt: bridge tasks did not stop within 5 s")
        if self.dropped:
            log.warning("mqtt: %d events dropped (queue bound %d)", self.dropped, self.cfg.queue_max)
        return self.stats()

    # -- bus side: events into the outbox --------------------------------------------

    async def _pump(self) -> None:
        assert self._queue is not None
        while True:
            self._accept(await self._queue.get())

    def _accept(self, ev: Event) -> None:
        try:
            if isinstance(ev, Partial):
                self._throttle_partial(ev)
                return
            if ev.kind in _ENDS_UTTERANCE:
                self._discard_pending_partial(ev.session_id)
                if ev.kind == "session/end":
                    self._last_partial.pop(ev.session_id, None)
            self._enqueue_event(ev)
        except Exception:  # one odd event must not stop the bridge
            self.encode_errors += 1
            log.exception("mqtt: cannot publish event %r", ev)

    def _throttle_partial(self, ev: Partial) -> None:
        """At most ``partial_rate_hz`` per session; the latest partial in a window still goes out."""
        sid = ev.session_id
        interval = 1.0 / self.cfg.partial_rate_hz
        now = time.monotonic()
        wait = self._last_partial.get(sid, -math.inf) + interval - now
        if wait <= 0:
            self._discard_pending_partial(sid)
            self._last_partial[sid] = now
            self._enqueue_event(ev)
            return
        if sid in self._pending_partial:
            _, handle = self._pending_partial[sid]
            self.partials_suppressed += 1
            self._pending_partial[sid] = (ev, handle)
            return
        handle = asyncio.get_running_loop().call_later(wait, self._flush_partial, sid)
        self._pending_partial[sid] = (ev, handle)

    def _flush_partial(self, sid: str) -> None:
        pending = self._pending_partial.pop(sid, None)
        if pending is not None and not self._closed:
            self._last_partial[sid] = time.monotonic()
            self._enqueue_event(pending[0])

    def _discard_pending_partial(self, sid: str) -> None:
        pending = self._pending_partial.pop(sid, None)
        if pending is not None:
            pending[1].cancel()
            self.partials_suppressed += 1

    def _enqueue_event(self, ev: Event) -> None:
        d = ev.to_dict()
        self._seq += 1
        d["seq"] = self._seq
        d["agent_id"] = self.cfg.agent_id
        self._enqueue(_Msg(f"{self.base}/{topic_safe(ev.session_id)}/{ev.kind}", encode(d)))

    def _enqueue(self, msg: _Msg) -> None:
        if self.queued >= self.cfg.queue_max:
            # Oldest first: after a long outage the operator wants the present, not the past.
            if self._outbox:
                self._outbox.popleft()
            else:
                msg = None  # type: ignore[assignment]  # everything queued is already on the wire
            self.dropped_full += 1
            if self.dropped_full == 1 or self.dropped_full % 1000 == 0:
                log.warning("mqtt: outbox full (%d), dropped %d events so far", self.cfg.queue_max, self.dropped_full)
            if msg is None:
                return
        self._outbox.append(msg)
        self._wake.set()

    # -- broker side -----------------------------------------------------------------

    def _status(self, state: str) -> bytes:
        return encode(
            {
                "version": SCHEMA_VERSION,
                "type": "status",
                "state": state,
                "agent_id": self.cfg.agent_id,
                "wall_time": time.time(),
                "delivered": self.delivered,
                "dropped": self.dropped,
            }
        )

    async def _connection_loop(self) -> None:
        delay = self.cfg.reconnect_min_s
        while not self._closing:
            was_connected = False
            try:
                was_connected = await self._connect_once()
            except asyncio.CancelledError:
                raise
            except aiomqtt.MqttError as exc:
                # Once per outage at warning level; the retries after it would only be noise.
                level = logging.WARNING if self._outage_logged is False else logging.DEBUG
                self._outage_logged = True
                log.log(
                    level, "mqtt: broker %s:%d unavailable (%s); events queue up", self.cfg.host, self.cfg.port, exc
                )
            except Exception:
                log.exception("mqtt: connection failed")
            finally:
                self._connected.clear()
                self._client = None
                if self._inflight:  # unacknowledged: send again on the next connection
                    self._outbox.extendleft(reversed(self._inflight))
                    self._inflight = []
            if was_connected:
                delay = self.cfg.reconnect_min_s
                self._outage_logged = False
            # Jitter spreads the reconnects of many agents after a broker restart.
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, self.cfg.reconnect_max_s)

    async def _connect_once(self) -> bool:
        cfg = self.cfg
        client = aiomqtt.Client(
            cfg.host or "",
            cfg.port,
            username=cfg.username,
            password=cfg.password,
            identifier=self._identifier,
            will=aiomqtt.Will(self.status_topic, self._status("offline"), qos=1, retain=True),
            keepalive=cfg.keepalive_s,
            tls_context=self._tls,
            timeout=cfg.publish_timeout_s,
        )
        client.pending_calls_threshold = _WINDOW + 4  # our window is deliberate, not a backlog
        async with client:
            self._client = client
            await client.subscribe(f"{self.base}/+/control/#", qos=1)
            await client.publish(self.status_topic, self._status("online"), qos=1, retain=True)
            self.connects += 1
            self._connected.set()
            log.info("mqtt: connected to %s:%d as %s", cfg.host, cfg.port, self._identifier)
            tasks = [asyncio.create_task(self._send_loop(client)), asyncio.create_task(self._control_loop(client))]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            for t in done:
                t.result()  # re-raise why the connection ended
        return True

    async def _send_loop(self, client: aiomqtt.Client) -> None:
        while True:
            if not self._outbox:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = [self._outbox.popleft() for _ in range(min(_WINDOW, len(self._outbox)))]
            self._inflight = batch
            results = await asyncio.gather(
                *(client.publish(m.topic, m.payload, qos=1, retain=m.retain) for m in batch), return_exceptions=True
            )
            failed = [m for m, r in zip(batch, results, strict=True) if isinstance(r, BaseException)]
            self.delivered += len(batch) - len(failed)
            self._inflight = []
            if failed:
                self._outbox.extendleft(reversed(failed))
                err = next(r for r in results if isinstance(r, BaseException))
                raise aiomqtt.MqttError(f"publish failed: {err}")

    async def _control_loop(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            task = asyncio.create_task(self._control(message))
            self._control_tasks.add(task)
            task.add_done_callback(self._control_tasks.discard)

    # -- control ---------------------------------------------------------------------

    async def _control(self, message: aiomqtt.Message) -> None:
        # {sid}/control/{command...}; "#" also matches a bare {sid}/control, whose command is ""
        parts = str(message.topic.value)[len(self.base) + 1 :].split("/", 2)
        sid, command = parts[0], parts[2] if len(parts) > 2 else ""
        request_id: Any = None
        try:
            if message.retain:
                # A retained command would fire again on every reconnect.
                raise ControlError("retained control messages are ignored; publish with retain=false")
            payload = message.payload
            if not isinstance(payload, bytes | bytearray):
                payload = str(payload if payload is not None else "").encode()
            if len(payload) > MAX_CONTROL_BYTES:
                raise ControlError(f"payload over {MAX_CONTROL_BYTES} bytes")
            body, request_id = _parse_body(bytes(payload))
            session = self._agent.sessions.get(sid)
            if session is None:
                raise ControlError(f"no live session {sid!r}")
            await self._apply(session, command, body)
        except (ControlError, ConfigError) as exc:
            self._reply(sid, command, request_id, str(exc))
            return
        except Exception as exc:  # the session refused; report it, keep serving
            log.exception("mqtt: control %s on %s failed", command, sid)
            self._reply(sid, command, request_id, f"{type(exc).__name__}: {exc}")
            return
        self._reply(sid, command, request_id, None)

    async def _apply(self, session: ControllableSession, command: str, body: Any) -> None:
        if command == "say":
            text = body.get("text") if isinstance(body, dict) else body
            if not isinstance(text, str) or not text.strip():
                raise ControlError('say needs non-empty text: {"text": "..."} or a plain-text payload')
            await session.say(text.strip())
        elif command == "hangup":
            session.hangup_requested.set()
        elif command == "transfer":
            to = body.get("to") if isinstance(body, dict) else body
            if not isinstance(to, str) or not TRANSFER_TARGET.fullmatch(to.strip()):
                raise ControlError('transfer needs a SIP or tel URI: {"to": "sip:desk@10.0.0.5"} or a plain-text '
                                   'payload')
            session.request_transfer(to.strip())
        elif command in ("mute", "unmute"):
            session.set_muted(command == "mute")
        elif command == "config/budgets":
            if not isinstance(body, dict) or not body:
                raise ControlError('config/budgets needs a JSON object, e.g. {"llm_block_ms": 60}')
            values = {k: v for k, v in body.items() if k != "id"}
            session.update_budgets(values)
        else:
            raise ControlError(f"unknown command {command!r}; expected one of {', '.join(COMMANDS)}")

    def _reply(self, sid: str, command: str, request_id: Any, error: str | None) -> None:
        if error is None:
            self.control_ok += 1
        else:
            self.control_errors += 1
            log.info("mqtt: control %s for %s rejected: %s", command, sid, error)
        reply = {
            "version": SCHEMA_VERSION,
            "type": "reply",
            "session_id": sid,
            "command": command,
            "ok": error is None,
            "error": error,
            "id": request_id,
            "wall_time": time.time(),
        }
        self._enqueue(_Msg(f"{self.base}/{topic_safe(sid)}/reply", encode(reply)))


def _parse_body(payload: bytes) -> tuple[Any, Any]:
    """JSON if it parses, else the plain text; also the optional request ``id`` to echo."""
    try:
        text = payload.decode()
    except UnicodeDecodeError:
        raise ControlError("payload is not UTF-8") from None
    if not text.strip():
        return None, None
    try:
        body = json.loads(text)
    except ValueError:
        if text.lstrip().startswith(("{", "[")):
            raise ControlError("payload looks like JSON but does not parse") from None
        return text, None
    request_id = body.get("id") if isinstance(body, dict) else None
    return body, request_id


async def start_mqtt(agent: BusOwner, cfg: MqttConfig) -> MqttBridge | None:
    """Start publishing ``agent``'s events; None when no broker is configured.

    Returns at once: connecting, and reconnecting, happen in the background.
    """
    if cfg.host is None:
        return None
    bridge = MqttBridge(agent, cfg)
    bridge.start()
    return bridge
