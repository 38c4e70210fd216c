"""The WebRTC media pieces on their own: the outgoing agent track, caller audio conversion
(48 kHz decoded Opus -> 16 kHz frames on the call timeline) and offer checks."""

from __future__ import annotations

import asyncio
import time

import av
import numpy as np
import pytest

from pipelines.transport import AudioOutput, RealtimeClock
from tests.speech import librivox
from voice.audio import read_wav, resample
from voice.transports.webrtc import (
    AgentAudioTrack,
    CallerAudioConverter,
    OfferError,
    av_frame_to_mono,
    check_offer,
)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


def test_track_is_an_audio_output() -> None:
    assert isinstance(AgentAudioTrack(FakeClock()), AudioOutput)


def test_play_reports_when_audio_starts_and_busy_until() -> None:
    clock = FakeClock()
    clock.t = 2.0
    track = AgentAudioTrack(clock, buffer_s=0.02)
    assert track.busy_until() <= 2.0  # idle
    assert track.play(np.ones(4800, np.int16)) == pytest.approx(2.02)  # nothing queued: next frame
    assert track.play(np.ones(9600, np.int16)) == pytest.approx(2.12)  # after the first 0.1 s
    assert track.busy_until() == pytest.approx(2.0 + 0.3 + 0.02)


async def test_an_idle_track_is_never_busy_now() -> None:
    clock = RealtimeClock()
    track = AgentAudioTrack(clock, buffer_s=0.02)
    t = clock.now()
    assert track.busy_until() <= t  # a session compares clock.now() < busy_until()
    track.play(np.ones(1920, np.int16))  # two frames
    for _ in range(3):
        await track.recv()
    t = clock.now()
    end = track.busy_until()
    # only the playout buffer can still be in flight (plus scheduling slack on a busy machine)
    assert end <= t + 0.02 + 0.05
    await asyncio.sleep(0.1)
    assert track.busy_until() < clock.now()
    track.stop()


async def test_recv_paces_20ms_frames_and_sends_silence_when_idle() -> None:
    track = AgentAudioTrack(RealtimeClock())
    tone = (np.sin(np.arange(4800) * 2 * np.pi * 440 / 48000) * 8000).astype(np.int16)
    track.play(tone)  # 0.1 s: five frames
    t0 = time.monotonic()
    frames = [await track.recv() for _ in range(26)]
    elapsed = time.monotonic() - t0
    assert 0.44 <= elapsed <= 0.8  # 25 frame periods after the first frame
    pcm = np.concatenate([f.to_ndarray().reshape(-1) for f in frames])
    assert all(f.samples == 960 and f.sample_rate == 48000 for f in frames)
    assert [f.pts for f in frames[:3]] == [0, 960, 1920]
    np.testing.assert_array_equal(pcm[:4800], tone)
    assert not pcm[4800:].any()
    assert track.voiced_frames_sent == 5 and track.frames_sent == 26
    track.stop()


async def test_interrupt_drops_queue_and_counts_heard_audio() -> None:
    track = AgentAudioTrack(RealtimeClock())
    track.begin_turn(1)
    track.play(np.full(48000, 1000, np.int16))
    for _ in range(10):
        await track.recv()
    heard = track.interrupt()
    assert heard == pytest.approx(0.2)
    frame = await track.recv()
    assert not frame.to_ndarray().any()
    track.begin_turn(2)
    assert track.interrupt() == 0.0
    track.stop()


def _av_frame(pcm: np.ndarray, fmt: str, layout: str, rate: int = 48000) -> av.AudioFrame:
    frame = av.AudioFrame.from_ndarray(pcm, format=fmt, layout=layout)
    frame.sample_rate = rate
    return frame


def test_av_frame_to_mono_handles_packed_and_planar() -> None:
    left = np.arange(960, dtype=np.int16)
    right = -left
    packed = np.stack([left, right], axis=1).reshape(1, -1)  # s16 stereo interleaved
    assert not av_frame_to_mono(_av_frame(packed, "s16", "stereo")).any()
    mono = av_frame_to_mono(_av_frame(left.reshape(1, -1), "s16", "mono"))
    np.testing.assert_array_equal(mono, left)
    planar = np.stack([np.full(960, 0.5, np.float32), np.full(960, 0.25, np.float32)])
    out = av_frame_to_mono(_av_frame(planar, "fltp", "stereo"))
    assert out.dtype == np.int16 and abs(int(out[0]) - int(0.375 * 32767)) <= 1


def test_converter_resamples_real_speech_once_and_keeps_the_timeline() -> None:
    speech16, _ = read_wav(librivox()[1].path)  # 3 s of recorded speech
    speech48 = resample(speech16, 16000, 48000)
    clock = FakeClock()
    clock.t = 5.0
    conv = CallerAudioConverter(clock, 16000)
    out = []
    pts = 123456  # RTP timestamps start anywhere
    for i in range(0, len(speech48) - 960, 960):
        f = conv.convert(speech48[i : i + 960], 48000, pts + i)
        if f is not None:
            out.append(f)
    assert out[0].timestamp == pytest.approx(5.0 - 0.02)  # placed where the first frame arrived
    for a, b in zip(out, out[1:], strict=False):
        assert b.timestamp == pytest.approx(a.end)
        assert b.sample_rate == 16000
    got = np.concatenate([f.pcm for f in out]).astype(np.float32)
    ref = speech16[: len(got)].astype(np.float32)
    lag = int(np.argmax(np.correlate(got[:16000], ref[:16000], "full"))) - 15999
    assert abs(lag) < 40  # soxr's group delay, a couple of ms
    n = min(len(got), len(ref)) - 200
    g = got[max(lag, 0) : max(lag, 0) + n]
    r = ref[max(-lag, 0) : max(-lag, 0) + n]
    assert np.corrcoef(g, r)[0, 1] > 0.98


def test_converter_fills_lost_packets_with_silence() -> None:
    conv = CallerAudioConverter(FakeClock(), 16000)
    ones = np.full(960, 3000, np.int16)
    a = conv.convert(ones, 48000, 0)
    b = conv.convert(ones, 48000, 960 * 3)  # two packets lost
    c = conv.convert(ones, 48000, 960 * 4)
    frames = [f for f in (a, b, c) if f is not None]
    total = sum(len(f.pcm) for f in frames)
    assert 5 * 320 - 200 <= total <= 5 * 320  # 100 ms in; the resampler holds back its filter tail (~8 ms)
    assert frames[-1].end == pytest.approx(total / 16000)
    b_pcm = np.concatenate([f.pcm for f in frames])
    assert np.abs(b_pcm[400:900]).max() < 200  # the filled gap is silent


OPUS_OFFER = (
    "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"
    "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=rtpmap:111 opus/48000/2\r\n"
)


@pytest.mark.parametrize(
    ("sdp", "kind", "status", "words"),
    [
        (OPUS_OFFER, "answer", 400, '"type" must be "offer"'),
        ("", "offer", 400, "non-empty"),
        (None, "offer", 400, "non-empty"),
        ("hello there", "offer", 400, "v=0"),
        ("v=0\r\ns=-\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\na=rtpmap:96 VP8/90000\r\n", "offer", 400, "no audio"),
        (OPUS_OFFER.replace("111", "0").replace("opus/48000/2", "PCMU/8000"), "offer", 415, "PCMU"),
    ],
)
def test_check_offer_rejects_bad_offers(sdp: object, kind: str, status: int, words: str) -> None:
    with pytest.raises(OfferError) as err:
        check_offer(sdp, kind)
    assert err.value.status == status
    assert words in str(err.value)


def test_check_offer_accepts_opus() -> None:
    assert check_offer(OPUS_OFFER, "offer") == OPUS_OFFER


async def test_recv_after_stop_raises() -> None:
    from aiortc.mediastreams import MediaStreamError

    track = AgentAudioTrack(RealtimeClock())
    track.stop()
    with pytest.raises(MediaStreamError):
        await asyncio.wait_for(track.recv(), 1)
