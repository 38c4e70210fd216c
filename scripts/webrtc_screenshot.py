"""Screenshot of the WebRTC call page mid-call, for docs/webrtc.png.

    .venv/bin/python scripts/webrtc_screenshot.py [--out docs/webrtc.png] [--wav examples/call.wav]

Starts `voice-agent serve webrtc` on a free loopback port, opens its page in headless Debian
chromium (/usr/bin/chromium, driven by playwright, with the flags of
tests/test_webrtc_browser.py) whose fake microphone plays the WAV, presses Call, waits until
the agent has answered a turn and the caller's next words show as a partial, and saves the
screenshot. Everything stays on loopback. Loading the models takes 5-30 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.chromium import CHROMIUM, FLAGS  # noqa: E402
from voice.audio import read_wav, resample, write_wav  # noqa: E402

VIEWPORT = {"width": 1100, "height": 420}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mic_wav(src: Path, dest: Path, lead_s: float = 1.5, tail_s: float = 5.0) -> Path:
    """The caller's audio as chromium's fake microphone reads it best: 48 kHz 16-bit mono,
    with quiet before (the call is set up) and after (the last reply is heard)."""
    pcm, _ = read_wav(src, 16000)
    quiet = [np.zeros(int(16000 * s), np.int16) for s in (lead_s, tail_s)]
    write_wav(dest, resample(np.concatenate([quiet[0], pcm, quiet[1]]), 16000, 48000), 48000)
    return dest


def start_server(port: int, token: str, config: str | None) -> tuple[subprocess.Popen[str], str]:
    exe = ROOT / ".venv" / "bin" / "voice-agent"
    cmd = [str(exe) if exe.exists() else "voice-agent", "serve", "webrtc",
           "--host", "127.0.0.1", "--port", str(port), "--token", token]
    if config:
        cmd += ["--config", config]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    deadline = time.monotonic() + 180
    for line in proc.stdout:  # "WebRTC calls: open http://127.0.0.1:PORT/?token=..."
        if "open http" in line:
            return proc, line.split("open ", 1)[1].strip()
        if time.monotonic() > deadline:
            break
    proc.terminate()
    raise SystemExit(f"voice-agent serve webrtc did not start (exit status {proc.poll()})")


async def shoot(url: str, wav: Path, out: Path, profile: Path, within_s: float) -> None:
    from playwright.async_api import TimeoutError as PlaywrightTimeout
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        context = await p.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True,
            args=[*FLAGS, f"--use-file-for-fake-audio-capture={wav}%noloop"], viewport=VIEWPORT,
        )
        try:
            page = context.pages[0] if context.pages else await context.new_page()
            await page.goto(url)
            await page.click("#call")
            ms = within_s * 1000
            await page.wait_for_function("voiceAgent.state === 'in-call'", timeout=15000, polling=100)
            await page.wait_for_function("voiceAgent.turns.length >= 1", timeout=ms, polling=100)
            try:  # mid-call: a turn answered, the caller's next sentence arriving as a partial
                await page.wait_for_function(
                    "document.getElementById('partial').textContent.split(' ').length >= 3",
                    timeout=ms, polling=100)
            except PlaywrightTimeout:  # no partial in time: the answered turn is picture enough
                pass
            out.parent.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(out))
            await page.click("#hangup")
        finally:
            await context.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "webrtc.png")
    ap.add_argument("--wav", type=Path, default=ROOT / "examples" / "call.wav", help="the caller's speech")
    ap.add_argument("--config", help="agent config for the server (default: built-in defaults)")
    ap.add_argument("--within", type=float, default=60.0, help="seconds to wait for a turn (default 60)")
    args = ap.parse_args()
    if not CHROMIUM.exists():
        print(f"error: {CHROMIUM} is not installed (scripts/apt-packages.txt lists chromium)", file=sys.stderr)
        return 2
    token = secrets.token_urlsafe(12)
    proc, url = start_server(free_port(), token, args.config)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            wav = mic_wav(args.wav, Path(tmp) / "caller.wav")
            asyncio.run(shoot(url, wav, args.out.resolve(), Path(tmp) / "profile", args.within))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    print(f"screenshot written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
