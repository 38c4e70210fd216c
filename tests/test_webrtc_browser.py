"""Browser calls end to end: Debian chromium (driven by playwright) with a recorded speech WAV
as its microphone, the real agent behind `voice-agent serve webrtc`, all on loopback.

Set WEBRTC_SCREENSHOT=docs/webrtc.png to keep the mid-call screenshot for the docs.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from pipelines.config import AgentConfig
from pipelines.serve_webrtc import WebrtcServer
from tests.chromium import CHROMIUM, FLAGS
from tests.speech import librivox
from voice.asr import normalize_words
from voice.audio import read_wav, resample, write_wav
from voice.vad import WebRtcVad

TOKEN = "browser-test-token"

pytestmark = [
    pytest.mark.peer,
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed"),
]


def _agent_available() -> bool:
    try:
        import pipelines.agent  # noqa: F401
    except ImportError:
        return False
    return True


if not _agent_available():
    pytest.skip("pipelines.agent is not available yet", allow_module_level=True)


def recall(said: str, reference: str) -> float:
    ref = normalize_words(reference)
    got = set(normalize_words(said))
    return sum(w in got for w in ref) / max(1, len(ref))


@pytest.fixture(scope="module")
def mic_wav(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Two caller turns of recorded speech with room for the agent to answer, 48 kHz 16-bit."""
    first, second = librivox()[1], librivox()[4]
    a, _ = read_wav(first.path, 16000)
    b, _ = read_wav(second.path, 16000)

    def quiet(s: float) -> np.ndarray:
        return np.zeros(int(16000 * s), np.int16)

    pcm = np.concatenate([quiet(1.5), a, quiet(6.0), b, quiet(5.0)])
    path = tmp_path_factory.mktemp("mic") / "caller.wav"
    write_wav(path, resample(pcm, 16000, 48000), 48000)
    return path, [first.text, second.text]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server() -> AsyncIterator[WebrtcServer]:
    from pipelines.agent import Agent

    cfg = AgentConfig()
    agent = await Agent.load(cfg)
    srv = WebrtcServer(agent, cfg, TOKEN)
    await srv.start("127.0.0.1", 0)
    yield srv
    await srv.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def browser(mic_wav: tuple[Path, list[str]], tmp_path: Path) -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        context = await p.chromium.launch_persistent_context(
            str(tmp_path / "profile"),  # a fresh --user-data-dir
            executable_path=str(CHROMIUM),
            headless=True,
            args=[*FLAGS, f"--use-file-for-fake-audio-capture={mic_wav[0]}%noloop"],
            viewport={"width": 1100, "height": 420},
        )
        yield context
        await context.close()


async def until(page: Any, expr: str, within: float) -> None:
    await page.wait_for_function(expr, timeout=within * 1000, polling=100)


async def connection_info(page: Any, within: float) -> dict[str, Any]:
    """The call's addresses and codec once the browser's statistics have them all: "in-call"
    can come a few ms before the nominated candidate pair and the inbound codec show there."""
    deadline = time.monotonic() + within
    while True:
        info = await page.evaluate("voiceAgent.connectionInfo()")
        if (info and info["remote"] and info["local"] and info["codec"]) or time.monotonic() > deadline:
            return info
        await asyncio.sleep(0.1)


def local_addresses() -> set[str]:
    import ifaddr

    return {ip.ip if isinstance(ip.ip, str) else ip.ip[0] for a in ifaddr.get_adapters() for ip in a.ips}


def voiced_seconds(pcm16k: np.ndarray) -> float:
    vad = WebRtcVad(2, 16000, 20)
    n = len(pcm16k) // 320
    return sum(vad.is_speech(pcm16k[i * 320 : (i + 1) * 320]) for i in range(n)) * 0.02


def envelope(pcm: np.ndarray, rate: int) -> np.ndarray:
    n = rate // 50
    frames = pcm[: len(pcm) // n * n].astype(np.float32).reshape(-1, n)
    return np.sqrt((frames**2).mean(axis=1))


def reply_matches(heard: np.ndarray, sent: np.ndarray, max_lag: int = 150) -> list[float]:
    """For each burst of agent audio the server sent, the envelope correlation with the best
    aligned stretch of what the browser heard. Each reply is aligned on its own: the browser's
    jitter buffer stretches time a little between replies."""
    active = sent > 0.1 * sent.max()
    bursts: list[tuple[int, int]] = []
    start = None
    for i, a in enumerate(np.append(active, False)):
        if a and start is None:
            start = i
        elif not a and start is not None:
            if bursts and start - bursts[-1][1] < 25:  # pauses inside one reply
                bursts[-1] = (bursts[-1][0], i)
            else:
                bursts.append((start, i))
            start = None
    out = []
    for b0, b1 in bursts:
        lo, hi = max(0, b0 - 10), min(len(sent), b1 + 10)
        ref = sent[lo:hi]
        best = -1.0
        for lag in range(-max_lag, max_lag + 1):
            if lo + lag < 0 or lo + lag + len(ref) > len(heard):
                continue
            best = max(best, float(np.corrcoef(heard[lo + lag : lo + lag + len(ref)], ref)[0, 1]))
        out.append(best)
    return out


async def test_browser_call_transcribes_answers_and_reports_the_gap(
    server: WebrtcServer, browser: Any, mic_wav: tuple[Path, list[str]], tmp_path: Path
) -> None:
    page = browser.pages[0] if browser.pages else await browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    await page.goto(server.url + f"?token={TOKEN}&record")
    assert "token" not in page.url  # the page takes the token out of the address bar
    await page.click("#call")
    await until(page, "voiceAgent.state === 'in-call'", 15)
    call = next(iter(server.calls.values()))
    sent: list[np.ndarray] = []
    pull = call.output._pull

    def tap(n: int) -> tuple[np.ndarray, bool]:  # what the server sends, to compare with what arrives
        pcm, voiced = pull(n)
        sent.append(pcm)
        return pcm, voiced

    call.output._pull = tap  # type: ignore[method-assign]
    info = await connection_info(page, 10)
    # The server offers 127.0.0.1 only. Chromium may still send from another address of this
    # machine (its eth0 host candidate), but then to 127.0.0.1: nothing leaves the host.
    assert info["remote"] == "127.0.0.1", info
    assert info["local"] in local_addresses(), info
    assert info["codec"] == "audio/opus/48000"

    await until(page, "voiceAgent.turns.length >= 1", 40)
    # mid-call: turn 1 answered, the caller's second sentence arriving as partials
    await until(page, "document.getElementById('partial').textContent.split(' ').length >= 3", 30)
    shot = tmp_path / "webrtc.png"
    await page.screenshot(path=str(shot))
    if os.environ.get("WEBRTC_SCREENSHOT"):
        shutil.copy(shot, os.environ["WEBRTC_SCREENSHOT"])
    await until(page, "voiceAgent.turns.length >= 2 && voiceAgent.browserGaps.length >= 2", 40)

    said = await page.locator("#transcript li.caller").all_inner_texts()
    replies = await page.locator("#transcript li.agent").all_inner_texts()
    assert len(said) == 2 and len(replies) == 2
    for text, reference in zip(said, mic_wav[1], strict=True):
        assert recall(text, reference) >= 0.6, (text, reference)

    turns = await page.evaluate("voiceAgent.turns.map(t => ({gap: t.gapMs, reply: t.reply}))")
    gaps = await page.evaluate("voiceAgent.browserGaps")
    assert all(isinstance(t["gap"], int | float) and t["gap"] > 0 for t in turns)
    assert all(50 < g < 15000 for g in gaps), gaps
    cells = await page.locator("#latency-rows td:nth-child(3)").all_inner_texts()
    assert [int(c.removesuffix(" ms")) for c in cells[:2]] == pytest.approx(gaps[:2], abs=0.51)
    assert call.client_gaps_ms[:2] == pytest.approx(gaps[:2])  # reported back over the data channel

    # the agent's voice reached the browser, and it is speech
    while call.output.busy_until() > call.clock.now():
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # the browser's jitter buffer and WebAudio lag the server
    rec = await page.evaluate("voiceAgent.takeRecording()")
    heard = np.frombuffer(base64.b64decode(rec["pcm"]), np.int16)
    heard16 = resample(heard, int(rec["rate"]), 16000)
    assert voiced_seconds(heard16) >= 0.3
    sent16 = resample(np.concatenate(sent), 48000, 16000)
    matches = reply_matches(envelope(heard16, 16000), envelope(sent16, 16000))
    assert len(matches) >= 2 and min(matches) > 0.8, matches
    peak = await page.evaluate("voiceAgent.agentPeakDb")
    assert peak > -40
    await page.click("#hangup")
    await until(page, "voiceAgent.state === 'idle'", 5)
    deadline = time.monotonic() + 10
    while server.calls and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not server.calls and call.end_reason == "hangup"
    assert not errors, errors


async def test_two_browser_calls_are_independent(
    server: WebrtcServer, browser: Any, mic_wav: tuple[Path, list[str]]
) -> None:
    a = browser.pages[0] if browser.pages else await browser.new_page()
    b = await browser.new_page()
    for page in (a, b):
        await page.goto(server.url + f"?token={TOKEN}")
    await asyncio.gather(a.click("#call"), b.click("#call"))
    await asyncio.gather(*(until(p, "voiceAgent.state === 'in-call'", 15) for p in (a, b)))
    ids = [await p.evaluate("voiceAgent.sessionId") for p in (a, b)]
    assert ids[0] != ids[1] and set(ids) == set(server.calls)
    await asyncio.gather(*(until(p, "voiceAgent.turns.length >= 1", 60) for p in (a, b)))
    call_b = server.calls[ids[1]]

    await a.close(run_before_unload=True)  # the caller closes the tab mid-call
    deadline = time.monotonic() + 10
    while ids[0] in server.calls and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert ids[0] not in server.calls
    assert ids[1] in server.calls and call_b.end_reason is None

    await until(b, "voiceAgent.turns.length >= 2", 60)  # the other call goes on
    said = await b.locator("#transcript li.caller").all_inner_texts()
    assert recall(said[-1], mic_wav[1][1]) >= 0.6
    assert await b.evaluate("voiceAgent.errors.length") == 0
    await b.click("#hangup")


async def test_page_shows_errors_and_reconnects(server: WebrtcServer, browser: Any) -> None:
    page = browser.pages[0] if browser.pages else await browser.new_page()
    await page.goto(server.url + "?token=not-the-token")
    await page.click("#call")
    await until(page, "voiceAgent.state === 'error'", 15)
    assert "wrong token" in await page.inner_text("#error-text")
    assert await page.is_visible("#token")  # the page asks for the right one
    await page.fill("#token", TOKEN)
    await page.click("#reconnect")
    await until(page, "voiceAgent.state === 'in-call'", 15)
    first = await page.evaluate("voiceAgent.sessionId")
    await server.calls[first].pc.close()  # the connection dies under the caller
    await until(page, f"voiceAgent.state === 'in-call' && voiceAgent.sessionId !== '{first}'", 20)
    assert any("reconnecting" in e for e in await page.evaluate("voiceAgent.errors"))
    assert first not in server.calls and len(server.calls) == 1
    await page.click("#hangup")
