"""Replies from an OpenAI-compatible server shared by many voice workers (``llm.backend: openai``).

`RemoteResponder` keeps the session's contract with `llm.responder.Responder`: ``agenerate``
returns a `Reply`, is cancellable, and takes a deadline. Each call is one streamed chat
completion over a keep-alive connection pool shared by every call of the worker:

- the history goes as chat messages after a system prompt (``llm.openai.system_prompt``);
- with ``ready`` (the session passes "the first clause for TTS is complete"), the `Reply`
  comes back as soon as the streamed text satisfies it, and its ``tail`` task reads the rest;
- the deadline (the LLM stage's budget) bounds the time to that first clause; a miss closes
  the request and raises `RemoteLmError` ``deadline``;
- cancelling the awaiting task, or `Reply.cancel`, closes the HTTP response: the server sees
  the client leave and stops generating;
- faults raise `RemoteLmError` (`llm.remote_errors`); retryable ones are retried inside the
  deadline after a back-off shared by every call, so a dead server is not hammered by every
  speculation of every call. A refused key (401/403) is logged once, and later calls fail at
  once without a request.

There is no warm start (re-denoising) on a remote model. The turn-end probe needs a local
model: it is the embedded MDLM's when ``llm.openai.local_turn_end`` is set, else there is none.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import openai

from llm.config import LlmConfig, OpenAIConfig
from llm.decoder import DecodeStats
from llm.remote_errors import RemoteLmError, classify
from llm.responder import Reply, Responder
from llm.turn_end_lm import CALIBRATION_FILE

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 3  # per call without a deadline; with one, as many as fit in it


class Backoff:
    """Exponential back-off shared by every call: after a failure no request is sent until it
    runs out; each failure in a row doubles it (from ``min_s`` up to ``max_s``), a success
    resets it. A server's Retry-After is honoured as a floor."""

    def __init__(self, min_s: float, max_s: float) -> None:
        self.min_s, self.max_s = min_s, max_s
        self.delay_s = 0.0
        self._until = 0.0
        self.last_error: RemoteLmError | None = None

    def wait_s(self) -> float:
        return max(0.0, self._until - time.monotonic())

    def failed(self, err: RemoteLmError) -> None:
        self.delay_s = min(self.max_s, max(self.min_s, self.delay_s * 2))
        self._until = time.monotonic() + max(self.delay_s, err.retry_after_s or 0.0)
        self.last_error = err

    def succeeded(self) -> None:
        self.delay_s = 0.0
        self._until = 0.0


@dataclass
class _Streamed:
    """What a stream has delivered so far."""

    t0: float
    parts: list[str] = field(default_factory=list)
    chunks: int = 0  # chunks with reply text
    usage_tokens: int | None = None
    first_s: float | None = None  # seconds from the request to the first reply text

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def add(self, chunk: Any) -> None:
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            self.usage_tokens = int(usage.completion_tokens)
        choices = getattr(chunk, "choices", None)
        if not isinstance(choices, list):
            raise ValueError(f"a chunk without choices: {str(chunk)[:120]}")
        for choice in choices:
            content = choice.delta.content if choice.delta is not None else None
            if content is None:
                continue
            if not isinstance(content, str):
                raise TypeError(f"delta content is {type(content).__name__}, not text")
            if self.first_s is None:
                self.first_s = time.perf_counter() - self.t0
            self.parts.append(content)
            self.chunks += 1


class RemoteResponder:
    warm_start = False  # nothing to re-denoise: the model is on the server
    streams = True  # `agenerate(ready=...)` returns at the first clause, the rest in `Reply.tail`

    def __init__(self, cfg: LlmConfig, local: Responder | None = None) -> None:
        if cfg.openai is None:
            raise ValueError("llm.openai is required for the openai backend")
        self.cfg = cfg
        self.ocfg: OpenAIConfig = cfg.openai
        self.local = local  # the embedded model, for the turn-end probe only
        self.turn_end = local.turn_end if local is not None else None
        self.url = self.ocfg.base_url.rstrip("/")
        self._key = os.environ.get(self.ocfg.api_key_env)
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, openai.AsyncOpenAI] = (
            weakref.WeakKeyDictionary())
        self.backoff = Backoff(self.ocfg.retry_min_ms / 1000, self.ocfg.retry_max_ms / 1000)
        self._auth_error: RemoteLmError | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self.requests = 0  # sent
        self.cancelled = 0  # closed by us before the end (a cancelled speculation, a missed deadline)
        self.failed = 0

    @property
    def name(self) -> str:
        """The model the server runs, as plugins report it."""
        return self.ocfg.model

    @classmethod
    def load(cls, cfg: LlmConfig, turn_end: bool = True) -> RemoteResponder:
        """``turn_end`` and ``llm.openai.local_turn_end``: load the embedded MDLM for the probe
        (or the turn-end LM that ``llm.turn_end_model_path`` names)."""
        assert cfg.openai is not None
        local = None
        if turn_end and cfg.openai.local_turn_end:
            path = cfg.turn_end_model_path
            if path and (Path(path).expanduser() / CALIBRATION_FILE).exists():  # beside the embedded reply model
                local = Responder.load(LlmConfig(turn_end_model_path=path, threads=cfg.threads))
            else:
                local = Responder.load(LlmConfig(model_path=path, threads=cfg.threads))
        return cls(cfg, local)

    def turn_end_prob(self, user_text: str) -> float | None:
        return self.local.turn_end_prob(user_text) if self.local is not None else None

    def client(self) -> openai.AsyncOpenAI:
        """The running loop's client: a connection pool belongs to one event loop."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            timeout_s = self.ocfg.timeout_ms / 1000
            n = self.ocfg.max_connections
            http = openai.DefaultAsyncHttpxClient(
                limits=httpx2.Limits(max_connections=n, max_keepalive_connections=n, keepalive_expiry=60.0),
                timeout=httpx2.Timeout(timeout_s),
            )
            client = openai.AsyncOpenAI(base_url=self.url, api_key=self._key or "unset", max_retries=0,
                                        timeout=timeout_s, http_client=http)
            self._clients[loop] = client
        return client

    async def aclose(self) -> None:
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    def visible_history(self, history: list[tuple[str, str]] | tuple = ()) -> list[tuple[str, str]]:
        """The turns of the conversation a request carries (``llm.openai.history_turns``): all
        a reply cache must key on besides the words, the system prompt and the model."""
        n = self.ocfg.history_turns
        return list(history)[-n:] if n else []

    def messages(self, user_text: str, history: list[tuple[str, str]] | tuple = ()) -> list[dict[str, str]]:
        out = [{"role": "system", "content": self.ocfg.system_prompt}]
        for said, answered in self.visible_history(history):
            out.append({"role": "user", "content": said})
            if answered:  # a reply the caller cut off before hearing any of it is not sent
                out.append({"role": "assistant", "content": answered})
        out.append({"role": "user", "content": user_text})
        return out

    async def agenerate(
        self, user_text: str, history: list[tuple[str, str]] | tuple = (), deadline_s: float | None = None,
        prev: Reply | None = None, ready: Callable[[str], bool] | None = None,
    ) -> Reply:
        """The reply to ``user_text``; ``deadline_s`` bounds the time to ``ready`` (or to the whole
        reply without it). ``prev`` is accepted for the contract and ignored (no warm start)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + deadline_s if deadline_s is not None else None
        state = _Streamed(time.perf_counter())
        stream: openai.AsyncStream[Any] | None = None
        sent = self.requests
        done = False
        try:
            async with asyncio.timeout_at(deadline):
                stream = await self._open(self.messages(user_text, history), deadline)
                done = await self._read(stream, state, ready)
        except TimeoutError:
            self.cancelled += self.requests > sent  # a request in flight is abandoned: its connection closes
            await _close(stream)
            raise self._failure(RemoteLmError(
                "deadline", f"{self.url}: no reply within the {deadline_s * 1000:.0f} ms deadline (LLM stage budget)"
                if deadline_s is not None else f"{self.url}: timed out")) from None
        except asyncio.CancelledError:
            self.cancelled += self.requests > sent
            await _close(stream)
            raise
        except RemoteLmError as err:
            await _close(stream)
            raise self._failure(err) from None
        assert stream is not None
        reply = self._reply(state, user_text)
        if done:
            self._finish(reply, state)
            await _close(stream)  # read to the end: the connection goes back to the pool
        else:
            reply.tail = asyncio.ensure_future(self._rest(stream, state, reply))
            reply.tail.add_done_callback(lambda t: self._close_if_cancelled(t, stream))
        return reply

    def _close_if_cancelled(self, tail: asyncio.Task[str], stream: openai.AsyncStream[Any]) -> None:
        """A tail cancelled before it first ran never reaches its ``finally``: close its stream here."""
        if tail.cancelled() and not stream.response.is_closed:
            self.cancelled += 1
            closing = asyncio.ensure_future(_close(stream))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    def _failure(self, err: RemoteLmError) -> RemoteLmError:
        if not err.repeat:
            self.failed += 1
        return err

    async def _open(self, messages: list[dict[str, str]], deadline: float | None) -> openai.AsyncStream[Any]:
        if self._auth_error is not None:
            raise self._auth_error.again()
        loop = asyncio.get_running_loop()
        attempts = 0
        while True:
            wait = self.backoff.wait_s()
            if wait > 0:
                last = self.backoff.last_error
                if (deadline is not None and loop.time() + wait >= deadline) or attempts >= MAX_ATTEMPTS:
                    cause = f" after {last.kind}: {last}" if last is not None else ""
                    raise RemoteLmError("backoff", f"{self.url}: not sent, next try in {wait * 1000:.0f} ms{cause}",
                                        last.status if last is not None else None)
                await asyncio.sleep(wait)
            attempts += 1
            self.requests += 1
            try:
                stream = await self.client().chat.completions.create(
                    model=self.ocfg.model, messages=messages, stream=True,  # type: ignore[arg-type]
                    max_tokens=self.ocfg.max_tokens, temperature=self.ocfg.temperature,
                    stream_options={"include_usage": True}, extra_body=self.ocfg.extra_body or None,
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                err = classify(exc, self.url)
                if err.kind == "auth":
                    self._auth_error = err
                    log.error("llm: %s. Set a valid key in $%s and restart; until then every reply is the "
                              "fallback.", err, self.ocfg.api_key_env)
                    raise err from None
                if not err.retryable:
                    raise err from None
                self.backoff.failed(err)
                log.warning("llm: %s (attempt %d; backing off %.0f ms)", err, attempts, self.backoff.delay_s * 1000)
                if deadline is None and attempts >= MAX_ATTEMPTS:
                    raise err from None
                continue
            self.backoff.succeeded()
            return stream

    async def _read(self, stream: openai.AsyncStream[Any], state: _Streamed,
                    until: Callable[[str], bool] | None) -> bool:
        """Read chunks into ``state`` until the stream ends (True) or ``until(text)`` (False)."""
        while True:
            try:
                chunk = await stream.__anext__()
                state.add(chunk)
            except StopAsyncIteration:
                return True
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                err = classify(exc, self.url)
                if err.retryable:
                    self.backoff.failed(err)
                raise err from None
            if until is not None and state.parts and until(state.text):
                return False

    async def _rest(self, stream: openai.AsyncStream[Any], state: _Streamed, reply: Reply) -> str:
        """The tail of a reply returned early: the rest of the stream, then the whole text."""
        try:
            await self._read(stream, state, None)
        except RemoteLmError as err:
            self._failure(err)
            reply.error = err
            log.warning("llm: reply cut short after %d chars: %s", len(state.text), err)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            await _close(stream)
        self._finish(reply, state)
        return state.text.strip()

    def _reply(self, state: _Streamed, user_text: str) -> Reply:
        stats = DecodeStats(steps=state.chunks, total_s=time.perf_counter() - state.t0)
        return Reply(state.text.strip(), [], [], [], stats, user_text, n_tokens=state.chunks)

    def _finish(self, reply: Reply, state: _Streamed) -> None:
        """The stream has ended: the request's statistics (``text`` stays what was returned)."""
        reply.stats.steps = state.chunks
        reply.stats.total_s = time.perf_counter() - state.t0
        reply.n_tokens = state.usage_tokens if state.usage_tokens is not None else state.chunks


async def _close(stream: openai.AsyncStream[Any] | None) -> None:
    """Close the response: unread, its connection is dropped, and the server sees the client leave."""
    if stream is not None:
        try:
            await stream.close()
        except Exception:  # closing a broken connection may fail; it is gone either way
            log.debug("llm: closing a stream failed", exc_info=True)
