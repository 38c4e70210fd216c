"""The agent: engines loaded once, shared by every call session, plus the event bus."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import numpy as np

from llm.fingerprint import model_fingerprint
from llm.remote import RemoteResponder
from llm.responder import Responder
from pipelines.admission import Admission, Seat
from pipelines.allocator import TRIM_EVERY_S, release_free_memory
from pipelines.config import AgentConfig, ConfigError
from pipelines.events import EventBus
from pipelines.gc_policy import collect_ended_call, freeze_loaded
from pipelines.reply_cache.cache import ReplyCache
from pipelines.session import CallSession, Engines
from pipelines.transport import AudioOutput, Clock
from voice.asr import AsrLoadError, WhisperEngine
from voice.smart_turn import SmartTurn
from voice.transports.base import Refusal
from voice.tts import PiperTTS, TtsLoadError
from voice.workers import EngineWorkers, workers_of

log = logging.getLogger(__name__)


def load_engines(cfg: AgentConfig) -> Engines:
    """Blocking: loads Whisper, the diffusion LM (or a client of a remote one, ``llm.backend``)
    and Piper, and warms each one up."""
    import torch

    # Each engine gets its own small thread pool: on 2 cores, spin-waiting OpenMP pools
    # fighting each other were measured 25x slower (PITFALLS.md).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    torch.set_num_threads(cfg.llm.threads)
    try:
        asr = WhisperEngine(cfg.asr)
    except AsrLoadError as exc:
        raise ConfigError(f"asr.model_path: {exc}") from None
    responder: Responder | RemoteResponder
    if cfg.llm.backend == "openai":
        # the server may still be starting: a call goes on without it (the fallback answers)
        responder = RemoteResponder.load(cfg.llm, turn_end=cfg.turn.lm_end_of_turn)
    else:
        from llm.loader import ModelLoadError

        try:
            responder = Responder.load(cfg.llm)
        except ModelLoadError as exc:  # a missing or broken model: one line naming the key
            raise ConfigError(str(exc)) from None
        responder.generate("hello")
    try:
        tts = PiperTTS(cfg.tts)
    except TtsLoadError as exc:
        raise ConfigError(f"tts.model_path: {exc}") from None
    asr.warmup()
    tts.synth("Hello.")
    if cfg.cache.enabled and isinstance(responder, Responder):
        model_fingerprint(responder.lm.path)  # memoised: the agent's cache keys on it (a remote one: its name)
    turn_audio = None
    if cfg.turn.smart_turn:
        turn_audio = SmartTurn(cfg.turn.smart_turn_model)
        turn_audio.predict(np.zeros(16000, np.float32))
    if cfg.agent.engine_pools:
        # a queue of Whisper passes from four calls must not hold back another call's first audio
        threads = cfg.agent.engine_threads or os.cpu_count() or 1
        for name, engine in (("asr", asr), ("llm", responder), ("tts", tts), ("smart_turn", turn_audio)):
            if engine is not None:
                engine.workers = EngineWorkers(name, threads)
    # the engines' objects live as long as the process: the cyclic collector stops walking
    # them, so collecting a call's garbage costs ~1 ms instead of ~335 ms (pipelines/gc_policy.py)
    freeze_loaded()
    return Engines(asr=asr, responder=responder, tts=tts, turn_audio=turn_audio)


def engine_queue_depth(engines: Engines) -> int:
    """Model jobs handed to worker threads and not yet started, over every engine."""
    pools = {id(w): w for w in (workers_of(e) for e in (engines.asr, engines.responder, engines.tts,
                                                        engines.turn_audio) if e is not None)}
    return sum(w.waiting for w in pools.values())


class Agent:
    def __init__(self, cfg: AgentConfig, engines: Engines) -> None:
        self.cfg = cfg
        self.engines = engines
        self.bus = EventBus()
        self.sessions: dict[str, CallSession] = {}
        # one capacity for every transport of this agent: SIP, WebRTC and replays count together
        self.admission = Admission(cfg.agent, queue_depth=lambda: engine_queue_depth(engines))
        # one reply cache for every call of this agent (and, with Redis, of every agent)
        self.reply_cache: ReplyCache | None = None
        if cfg.cache.enabled:
            self.reply_cache = ReplyCache.for_engines(cfg.cache, engines.responder, engines.tts)
            self.reply_cache.on_state = self._cache_state_changed
        self._trim: asyncio.Task[bool] | None = None
        self._trimmed_at = -TRIM_EVERY_S

    def call_ended(self) -> None:
        """A call closed: free its objects (a cyclic web, `pipelines.gc_policy`; about 1 ms on
        the loop) and give freed memory back to the OS (off the event loop, at most every
        `TRIM_EVERY_S`), so a long-running agent's RSS follows its live calls."""
        collect_ended_call()
        now = asyncio.get_running_loop().time()
        if (self._trim is None or self._trim.done()) and now - self._trimmed_at >= TRIM_EVERY_S:
            self._trimmed_at = now
            self._trim = asyncio.ensure_future(asyncio.to_thread(release_free_memory))

    def _cache_state_changed(self, up: bool, error: str) -> None:
        """The cache's backend went down or came back: every call in progress says so now."""
        for session in list(self.sessions.values()):
            session._note_cache_state()

    async def aclose(self) -> None:
        """Release what the agent holds outside its sessions (the cache's Redis connection)."""
        await self.admission.aclose()
        if self._trim is not None:
            await self._trim
        if self.reply_cache is not None:
            await self.reply_cache.aclose()

    @classmethod
    async def load(cls, cfg: AgentConfig | None = None) -> Agent:
        cfg = cfg or AgentConfig()
        engines = await asyncio.to_thread(load_engines, cfg)
        return cls(cfg, engines)

    @property
    def asr_engine(self) -> WhisperEngine:
        return self.engines.asr

    @property
    def responder(self) -> Responder | RemoteResponder:
        return self.engines.responder

    @property
    def tts(self) -> PiperTTS:
        return self.engines.tts

    def admit(self, transport: str) -> Seat | Refusal:
        """A seat for one more call, or a refusal (busy or overloaded): ask before answering."""
        return self.admission.admit(transport)

    def new_session(
        self, output: AudioOutput, clock: Clock, transport: str, session_id: str | None = None,
        seat: Seat | None = None,
    ) -> CallSession:
        """A session holding `seat` (from `admit`), or a new counted one (replays: never refused)."""
        seat = seat or self.admission.take(transport)
        session = _TrackedSession(self, output, clock, transport, session_id, seat)
        self.sessions[session.session_id] = session
        return session


class _TrackedSession(CallSession):
    """A session that leaves the agent's registry, and gives back its seat, when it closes."""

    def __init__(
        self, agent: Agent, output: AudioOutput, clock: Clock, transport: str, session_id: str | None,
        seat: Seat,
    ) -> None:
        super().__init__(agent.engines, agent.cfg, output, clock, agent.bus, transport, session_id,
                         reply_cache=agent.reply_cache)
        self._agent = agent
        self._seat = seat

    async def close(self, reason: str = "completed") -> dict:
        try:
            return await super().close(reason)
        finally:
            self._agent.sessions.pop(self.session_id, None)
            self._seat.release()
            self._agent.call_ended()


async def start_event_bridge(agent: Agent, cfg: AgentConfig) -> Any:
    """The MQTT event bridge when ``cfg.mqtt.host`` names a broker, else None."""
    if cfg.mqtt.host is None:
        return None
    try:
        from pipelines.mqtt import start_mqtt
    except ImportError:
        log.warning("MQTT requested but pipelines.mqtt is not available")
        return None
    return await start_mqtt(agent, cfg.mqtt)
