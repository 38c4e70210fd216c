"""`llm.remote.RemoteResponder` against a real OpenAI-compatible server: `transformers serve`
serving the repo's AR baseline on loopback (tests/openai_server.py), offline."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from llm.ar import ArLM
from llm.config import LlmConfig
from llm.remote import RemoteResponder
from llm.remote_errors import RemoteLmError
from tests.openai_server import TransformersServer, served_copy, transformers_server  # noqa: F401 (fixture "server")
from tests.tcp_relay import TcpRelay
from voice.tts import split_for_speech

# a reply of 100 tokens (~0.5 s here): the model may not end it sooner. The server takes the
# generation settings as a JSON string in `generation_config` (passed through extra_body).
LONG = {"generation_config": json.dumps({"min_new_tokens": 100})}


def first_clause_ready(text: str) -> bool:
    return len(split_for_speech(text, 4)) >= 2



def responder(base_url: str, model: str, **openai: object) -> RemoteResponder:
    cfg = {"base_url": base_url, "model": model, "timeout_ms": 2000, "retry_min_ms": 50, "retry_max_ms": 400,
           **openai}
    return RemoteResponder(LlmConfig(backend="openai", openai=cfg))


async def test_streams_the_first_clause_then_the_rest_as_the_local_model_would(server) -> None:
    r = responder(server.base_url, server.model)
    ar = ArLM.load()
    for text in ("can you hear me", "I want to talk to a person", "hello"):
        reply = await r.agenerate(text, deadline_s=5.0, ready=first_clause_ready)
        full = await reply.complete()
        # greedy decoding of the same weights, locally: the server wrote the same reply
        res = ar.generate(ar.prompt_ids(text))
        assert full == ar.tok.decode(res.ids), text
        assert full.startswith(reply.text)
        if first_clause_ready(full):  # it came back at the first clause, before the stream ended
            assert first_clause_ready(reply.text) and reply.tail is not None
            assert split_for_speech(reply.text, 4)[0] == split_for_speech(full, 4)[0]
        assert reply.n_tokens and reply.tokens_per_s and reply.stats.total_s > 0
    assert r.requests == 3 and r.failed == 0 and r.cancelled == 0


async def test_history_and_system_prompt_go_as_chat_messages(server) -> None:
    r = responder(server.base_url, server.model, history_turns=1)
    msgs = r.messages("and now", [("hi", "Hello!"), ("can you hear me", "Yes."), ("cut off", "")])
    assert msgs == [
        {"role": "system", "content": r.ocfg.system_prompt},
        {"role": "user", "content": "cut off"},  # the last turn only; its unheard reply is left out
        {"role": "user", "content": "and now"},
    ]
    reply = await r.agenerate("hello", [("hi", "Hello!")], deadline_s=5.0)
    assert reply.text and reply.tail is None  # no `ready`: the whole reply at once


async def test_cancelling_mid_stream_closes_the_request(server) -> None:
    relay = await TcpRelay(server.port).start()
    try:
        r = responder(relay.base_url, server.model, extra_body=LONG, max_tokens=110)
        # 1. a reply returned at its first clause, then dropped (a speculation that missed)
        reply = await r.agenerate("hello", deadline_s=5.0, ready=first_clause_ready)
        assert reply.tail is not None and not reply.tail.done()
        reply.cancel()
        assert await reply.complete() == reply.text  # its owner stopped it: what had come
        # 2. the awaiting task cancelled while the stream runs (a barge-in, a new hypothesis)
        task = asyncio.ensure_future(r.agenerate("how are you", deadline_s=5.0))
        await asyncio.sleep(0.15)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.2)
        assert len(relay.connections) == 2
        full = await r.agenerate("thanks", deadline_s=5.0)  # for scale: a whole 100-token reply's bytes
        whole = relay.connections[-1].to_client if len(relay.connections) == 3 else None
        for conn in relay.connections[:2]:
            # the client hung up mid-answer, which is how the server learns of the cancel
            assert conn.client_closed_first and conn.closed
            if whole is not None:
                assert conn.to_client < whole / 2
        assert r.cancelled == 2 and full.text
    finally:
        await relay.close()


async def test_a_missed_deadline_is_an_error_and_closes_the_request(server) -> None:
    relay = await TcpRelay(server.port).start()
    try:
        r = responder(relay.base_url, server.model, extra_body=LONG, max_tokens=110)
        t0 = time.perf_counter()
        with pytest.raises(RemoteLmError) as exc:
            await r.agenerate("hello", deadline_s=0.08)  # the whole reply needed: ~0.5 s
        took = time.perf_counter() - t0
        assert exc.value.kind == "deadline" and "80 ms" in str(exc.value)
        assert took < 0.3
        await asyncio.sleep(0.1)
        assert relay.connections[0].client_closed_first
        # the deadline is not the server's fault: the next call is sent at once
        assert (await r.agenerate("hello", deadline_s=5.0, ready=first_clause_ready)).text
    finally:
        await relay.close()


async def test_a_wrong_path_or_model_is_an_http_error_without_retries(server) -> None:
    r = responder(server.base_url.replace("/v1", "/nope/v1"), server.model)
    with pytest.raises(RemoteLmError) as exc:
        await r.agenerate("hello", deadline_s=5.0)
    assert exc.value.kind == "http" and exc.value.status == 404 and "/nope/v1" in str(exc.value)
    assert r.requests == 1  # the same request cannot succeed: not retried
    r = responder(server.base_url, "some-other-model")
    with pytest.raises(RemoteLmError) as exc:
        await r.agenerate("hello", deadline_s=5.0)
    assert exc.value.status == 400 and "pinned" in str(exc.value)


async def test_an_error_inside_the_stream_is_a_server_error(server) -> None:
    # 200 new tokens overrun the model's 128 positions: the server fails mid-stream and says so
    r = responder(server.base_url, server.model, max_tokens=300,
                  extra_body={"generation_config": json.dumps({"min_new_tokens": 200})})
    with pytest.raises(RemoteLmError) as exc:
        await r.agenerate("hello", deadline_s=5.0)
    assert exc.value.kind == "server" and "mid-stream" in str(exc.value)
    assert "index out of range" in str(exc.value)


async def test_a_stalled_stream_and_a_malformed_chunk_are_errors(server) -> None:
    relay = await TcpRelay(server.port).start()
    try:
        r = responder(relay.base_url, server.model, timeout_ms=300)
        relay.stall_after = 400  # the headers and part of the first chunk, then silence
        t0 = time.perf_counter()
        with pytest.raises(RemoteLmError) as exc:
            await r.agenerate("hello", deadline_s=5.0)
        assert exc.value.kind == "stall" and time.perf_counter() - t0 < 1.5
        relay.stall_after = None
        relay.rewrite = (b'"choices"', b'"choicez"')  # valid JSON, not a chunk
        r.backoff.succeeded()
        with pytest.raises(RemoteLmError) as exc:
            await r.agenerate("hello", deadline_s=5.0)
        assert exc.value.kind == "malformed" and "choices" in str(exc.value)
    finally:
        await relay.close()


async def test_server_killed_mid_call_then_restarted(tmp_path: Path) -> None:
    srv = TransformersServer(served_copy(tmp_path / "ar"), tmp_path / "serve.log")
    srv.start()
    try:
        r = responder(srv.base_url, srv.model, extra_body=LONG, max_tokens=110)
        assert (await r.agenerate("hello", deadline_s=5.0)).text
        reply = await r.agenerate("hello", deadline_s=5.0, ready=first_clause_ready)
        srv.stop()  # killed mid-stream
        assert await reply.complete() == reply.text or reply.error is not None
        assert reply.error is not None and reply.error.kind == "connect"
        with pytest.raises(RemoteLmError) as exc:  # refused, retried with back-off inside the deadline
            await r.agenerate("hello", deadline_s=0.3)
        assert exc.value.kind in ("connect", "backoff") and r.requests >= 3
        assert r.backoff.delay_s >= 0.05
        srv.start()
        await asyncio.sleep(r.backoff.wait_s())
        back = await r.agenerate("hello", deadline_s=5.0, ready=first_clause_ready)
        assert back.text and r.backoff.delay_s == 0.0
        back.cancel()
    finally:
        srv.stop()
