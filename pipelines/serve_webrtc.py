"""``voice-agent serve webrtc``: browser calls over WebRTC, one call session per peer.

    GET  /                     the call page (voice/transports/web/)
    POST /offer                {"sdp", "type": "offer"} + token -> {"sdp", "type": "answer", "session_id"}
    POST /calls/{id}/hangup    end a call (the page's unload beacon); token in the JSON body
    GET  /health               {"sessions": n, "max_sessions": m}

Beyond the agent's capacity (``agent.max_calls``, shared with its other transports) or
``webrtc.max_sessions``, or while the box is overloaded (``agent.overload_*``), an offer
gets 503 with Retry-After and nothing is set up for it.

The token comes from ``Authorization: Bearer <token>`` or a ``"token"`` field in the JSON
body. Every bad request gets a 4xx with a one-line JSON ``{"error": ...}``; the server and
the other calls go on.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import secrets
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from pipelines.cli_serve import get_serve_subparsers, stop_on_signals
from pipelines.config import AgentConfig, ConfigError, load_config
from voice.transports.base import Refusal
from voice.transports.webrtc import (
    OfferError,
    WebrtcCall,
    check_offer,
    first_line,
    keep_loopback_candidates,
    loopback_only_ice,
)

log = logging.getLogger(__name__)

WEB_DIR = Path(__file__).resolve().parent.parent / "voice" / "transports" / "web"
_STATIC = {"app.js": "application/javascript", "style.css": "text/css"}


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _busy(message: str, retry_after_s: int) -> web.Response:
    """503: no call is set up at all, so the caller may simply try again later."""
    return web.json_response({"error": message}, status=503, headers={"Retry-After": str(retry_after_s)})


class WebrtcServer:
    """The HTTP side: the page, signalling and the table of live calls."""

    def __init__(self, agent: Any, config: AgentConfig, token: str, idle_timeout_s: float | None = None) -> None:
        if not token:
            raise ValueError("a WebRTC server needs a non-empty token")
        self.agent = agent
        self.config = config
        self.token = token
        self.idle_timeout_s = config.webrtc.idle_timeout_s if idle_timeout_s is None else idle_timeout_s
        self.calls: dict[str, WebrtcCall] = {}
        self.reports: list[dict[str, Any]] = []  # finished calls, newest last (bounded)
        self._runner: web.AppRunner | None = None
        self._watchers: set[asyncio.Task[None]] = set()
        self.url = ""
        self.loopback = False  # bound to a loopback address: media stays on it too

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024)  # an SDP offer is a few kB
        app.router.add_get("/", self._page)
        app.router.add_get("/{name:app\\.js|style\\.css}", self._static)
        app.router.add_post("/offer", self._offer)
        app.router.add_post("/calls/{call_id}/hangup", self._hangup)
        app.router.add_get("/health", self._health)
        return app

    async def start(self, host: str, port: int) -> str:
        self.loopback = loopback_only_ice(host)
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1] if site._server and site._server.sockets else port  # type: ignore[union-attr]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{bound}/"
        return self.url

    async def stop(self) -> None:
        await asyncio.gather(
            *(call.close("server_shutdown") for call in list(self.calls.values())), return_exceptions=True
        )
        for task in list(self._watchers):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # handlers
    async def _page(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(WEB_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    async def _static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        return web.FileResponse(WEB_DIR / name, headers={"Cache-Control": "no-cache", "Content-Type": _STATIC[name]})

    async def _health(self, request: web.Request) -> web.Response:
        cap = self.config.webrtc.max_sessions
        agent_cap = getattr(getattr(self.config, "agent", None), "max_calls", None)
        limit = min(c for c in (cap, agent_cap) if c is not None)
        return web.json_response({"sessions": len(self.calls), "max_sessions": limit})

    def _authorized(self, request: web.Request, body: Any) -> web.Response | None:
        header = request.headers.get("Authorization", "")
        given = header[7:].strip() if header.lower().startswith("bearer ") else None
        if given is None and isinstance(body, dict) and isinstance(body.get("token"), str):
            given = body["token"]
        if not given:
            return _error(401, "missing token: send 'Authorization: Bearer <token>' (printed when the server started)")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return _error(403, "wrong token")
        return None

    async def _json_body(self, request: web.Request) -> tuple[Any, str | None]:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return None, "request body too large"
        try:
            return json.loads(raw.decode("utf-8")), None
        except (UnicodeDecodeError, ValueError):
            return None, 'body must be JSON: {"sdp": "...", "type": "offer"}'

    async def _offer(self, request: web.Request) -> web.Response:
        body, problem = await self._json_body(request)
        if (denied := self._authorized(request, body)) is not None:
            return denied
        if problem is not None or not isinstance(body, dict):
            return _error(400, problem or 'body must be a JSON object: {"sdp": "...", "type": "offer"}')
        try:
            sdp = check_offer(body.get("sdp"), body.get("type"))
        except OfferError as exc:
            return _error(exc.status, str(exc))
        if self.loopback:
            sdp = keep_loopback_candidates(sdp)
        cap = self.config.webrtc.max_sessions
        if cap is not None and len(self.calls) >= cap:
            return _busy(f"server busy: {len(self.calls)} calls in progress (max {cap})", 5)
        seat = None
        admit = getattr(self.agent, "admit", None)  # the agent's capacity, shared with its other transports
        if admit is not None:
            decision = admit("webrtc")
            if isinstance(decision, Refusal):
                return _busy(f"server {decision.detail}", decision.retry_after_s)
            seat = decision
        try:
            call = WebrtcCall(
                self.agent,
                asr_rate=self.config.audio.asr_rate,
                buffer_s=self.config.output.buffer_ms / 1000,
                idle_timeout_s=self.idle_timeout_s,
                seat=seat,
            )
        except BaseException:
            if seat is not None:
                seat.release()
            raise
        self.calls[call.id] = call
        try:
            answer = await call.answer(sdp)
        except OfferError as exc:
            await self._drop(call, seat)
            return _error(exc.status, str(exc))
        except Exception as exc:  # aiortc rejects some SDP only when applying it
            await self._drop(call, seat)
            log.info("offer rejected: %r", exc)
            return _error(400, f"cannot answer this offer: {first_line(exc)}")
        watcher = asyncio.ensure_future(self._reap(call))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        log.info("call %s answered (%d live)", call.id, len(self.calls))
        return web.json_response({"sdp": answer, "type": "answer", "session_id": call.id})

    async def _drop(self, call: WebrtcCall, seat: Any) -> None:
        await call.close("bad_offer")
        self.calls.pop(call.id, None)
        if seat is not None:
            seat.release()

    async def _reap(self, call: WebrtcCall) -> None:
        await call.closed.wait()
        self.calls.pop(call.id, None)
        if call.seat is not None:
            call.seat.release()
        if call.report is not None:
            self.reports.append(call.report)
            del self.reports[:-50]

    async def _hangup(self, request: web.Request) -> web.Response:
        body, _ = await self._json_body(request)
        if (denied := self._authorized(request, body)) is not None:
            return denied
        call = self.calls.get(request.match_info["call_id"])
        if call is None:
            return _error(404, "no such call (it may have ended already)")
        await call.close("hangup")
        return web.json_response({"ended": call.id})


# command line
def parse_mqtt_url(url: str) -> tuple[str, int]:
    """``mqtt://HOST[:PORT]`` -> (host, port)."""
    parts = urlsplit(url if "://" in url else f"mqtt://{url}")
    if parts.scheme not in ("mqtt", "tcp") or not parts.hostname:
        raise ConfigError(f"--mqtt must look like mqtt://HOST:PORT, got {url!r}")
    try:
        port = parts.port or 1883
    except ValueError:
        raise ConfigError(f"--mqtt has a bad port: {url!r}") from None
    return parts.hostname, port


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = get_serve_subparsers(subparsers)
    p = serve.add_parser(
        "webrtc",
        help="answer browser calls over WebRTC (serves the call page)",
        description=(
            "Serve a web page from which a person calls the agent over WebRTC (Opus 48 kHz both ways), "
            "and the signalling endpoint POST /offer. Offers must carry the token: the configured "
            "webrtc.token, --token, or a random one printed at start. Open the printed URL in a browser."
        ),
    )
    p.add_argument("--host", default=None, help="address to bind (default: webrtc.host, 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="TCP port (default: webrtc.port, 8080)")
    p.add_argument("--token", default=None, help="signalling token (default: webrtc.token, else random)")
    p.add_argument("--config", metavar="PATH", default=None, help="YAML config file")
    p.add_argument("--mqtt", metavar="mqtt://HOST:PORT", default=None, help="publish events to this MQTT broker")
    p.set_defaults(func=_run)


def _configure(args: argparse.Namespace) -> tuple[AgentConfig, str]:
    config = load_config(args.config)
    if args.host is not None:
        config.webrtc.host = args.host
    if args.port is not None:
        config.webrtc.port = args.port
    if args.token is not None:
        config.webrtc.token = args.token
    if args.mqtt:
        try:
            from pipelines.mqtt import apply_mqtt_url

            config.mqtt = apply_mqtt_url(config.mqtt, args.mqtt)
        except ImportError:
            config.mqtt.host, config.mqtt.port = parse_mqtt_url(args.mqtt)
    token = config.webrtc.token or secrets.token_urlsafe(12)
    return config, token


def _run(args: argparse.Namespace) -> int:
    try:
        config, token = _configure(args)
    except (ConfigError, ValueError) as exc:
        print(f"voice-agent serve webrtc: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(serve(config, token))
    except KeyboardInterrupt:
        return 0


async def serve(config: AgentConfig, token: str) -> int:
    from pipelines.agent import Agent, start_event_bridge

    stop = stop_on_signals()
    agent = await Agent.load(config)
    server = WebrtcServer(agent, config, token)
    try:
        url = await server.start(config.webrtc.host, config.webrtc.port)
    except OSError as exc:
        print(
            f"voice-agent serve webrtc: cannot listen on {config.webrtc.host}:{config.webrtc.port}: {exc}",
            file=sys.stderr,
        )
        await agent.aclose()
        return 1
    bridge = await start_event_bridge(agent, config)
    print(f"WebRTC calls: open {url}?token={token}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()
        if bridge is not None:
            await bridge.close()
        await agent.aclose()
    return 0
