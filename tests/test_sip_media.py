"""SIP bridge media units: G.711, RTP packets, the jitter buffer, DTMF, the audio output and the sender."""

from __future__ import annotations

import struct
import warnings

import numpy as np
import pytest

from tests.sip_support import SIPP_PCAPS, read_rtp_pcap
from tests.speech import hello_8k, jfk
from voice.audio import read_wav
from voice.transports.sip.dtmf import DtmfError, DtmfReceiver, build_event, parse_info_body
from voice.transports.sip.g711 import PCMA, PCMU
from voice.transports.sip.jitter import FrameKind, JitterBuffer
from voice.transports.sip.output import RtpAudioOutput
from voice.transports.sip.rtp import RtpError, RtpPacket, seq_delta, ts_delta
from voice.transports.sip.sdp import MediaPlan
from voice.transports.sip.sender import RtpSender


@pytest.fixture(scope="module")
def speech8k() -> np.ndarray:
    return read_wav(hello_8k())[0]


# --- G.711 ---


@pytest.mark.parametrize("codec,ref", [(PCMU, ("lin2ulaw", "ulaw2lin")), (PCMA, ("lin2alaw", "alaw2lin"))])
def test_g711_matches_the_reference_codec_bit_for_bit(codec, ref):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop")
    every = np.arange(-32768, 32768, dtype=np.int16)
    assert codec.encode(every) == getattr(audioop, ref[0])(every.tobytes(), 2)
    codes = bytes(range(256))
    assert np.array_equal(codec.decode(codes), np.frombuffer(getattr(audioop, ref[1])(codes, 2), dtype=np.int16))


@pytest.mark.parametrize("codec", [PCMU, PCMA])
def test_g711_round_trip_on_speech_keeps_telephone_quality(codec):
    pcm = read_wav(jfk().path, 8000)[0]
    out = codec.decode(codec.encode(pcm))
    err = (out.astype(np.float64) - pcm) ** 2
    snr = 10 * np.log10(np.mean(pcm.astype(np.float64) ** 2) / np.mean(err))
    assert snr > 30, snr  # G.711 gives about 38 dB on speech
    assert codec.decode(codec.silence_payload(160)).max() <= 8  # the silence code decodes to (near) zero


# --- RTP ---


def test_rtp_round_trip_and_header_fields():
    p = RtpPacket(0, 65535, 2**32 - 1, 0xDEADBEEF, b"\xff" * 160, marker=True)
    q = RtpPacket.parse(p.to_bytes())
    assert q == p


def test_rtp_parse_handles_csrc_extension_and_padding():
    header = struct.pack("!BBHII", 0x80 | 0x20 | 0x10 | 2, 8, 7, 1234, 99)  # padding, extension, 2 CSRCs
    csrc = b"\x00" * 8
    ext = struct.pack("!HH", 0xBEDE, 1) + b"\x01\x02\x03\x04"
    payload = b"\xd5" * 160
    packet = RtpPacket.parse(header + csrc + ext + payload + b"\x00\x00\x03")
    assert packet.payload == payload and packet.payload_type == 8 and packet.seq == 7


@pytest.mark.parametrize(
    "data",
    [b"", b"\x80\x00", b"\x40" + b"\x00" * 20, struct.pack("!BBHII", 0x80, 200, 1, 1, 1),  # RTCP SR on the RTP port
     struct.pack("!BBHII", 0xA0, 0, 1, 1, 1) + b"\x00\x40", struct.pack("!BBHII", 0x8F, 0, 1, 1, 1)],
)  # fmt: skip
def test_rtp_rejects_broken_packets(data):
    with pytest.raises(RtpError):
        RtpPacket.parse(data)


def test_sequence_and_timestamp_arithmetic_wraps():
    assert seq_delta(65535, 0) == 1 and seq_delta(0, 65535) == -1
    assert ts_delta(2**32 - 160, 0) == 160


# --- jitter buffer ---


def _packets(pcm: np.ndarray, n: int = 160, seq0: int = 100, ts0: int = 5000, ssrc: int = 1):
    return [(ssrc, (seq0 + i) & 0xFFFF, (ts0 + i * n) & 0xFFFFFFFF, pcm[i * n : (i + 1) * n])
            for i in range(len(pcm) // n)]  # fmt: skip


def _play(jb: JitterBuffer, packets: list, packet_ms: float = 20, extra_ticks: int = 10):
    """Deliver `packets` in list order, one every `packet_ms` (a repeat of the previous one arrives with it),
    and pop one frame per 20 ms tick."""
    arrivals, t = [], -packet_ms
    for i, p in enumerate(packets):
        if i == 0 or p is not packets[i - 1]:
            t += packet_ms
        arrivals.append((t, p))
    frames, kinds, tick = [], [], 0.0
    while arrivals or extra_ticks > 0:
        while arrivals and arrivals[0][0] <= tick:
            jb.push(*arrivals.pop(0)[1])
        if not arrivals:
            extra_ticks -= 1
        got = jb.pop()
        if got is not None:
            frames.append(got[0])
            kinds.append(got[1])
        tick += 20
    return np.concatenate(frames), kinds


def test_jitter_buffer_in_order_is_lossless(speech8k):
    pcm = speech8k[: 160 * 100]
    out, kinds = _play(JitterBuffer(target_ms=60), _packets(pcm))
    assert np.array_equal(out[: len(pcm)], pcm)
    assert kinds.count(FrameKind.AUDIO) == 100


def test_deep_jitter_buffer_keeps_the_first_packets_through_a_playout_stall(speech8k):
    # target 1000 ms: 50 frames of prebuffer, during which the playout loop stalled for three
    # 20 ms ticks while the caller's packets kept coming
    pcm = speech8k[: 160 * 80]
    jb = JitterBuffer(target_ms=1000)
    frames = []
    for i, p in enumerate(_packets(pcm) + [None] * 60):
        if p is not None:
            jb.push(*p)
        if i in (20, 21, 22):
            continue  # the stall: no pop
        got = jb.pop()
        if got is not None:
            frames.append(got[0])
    out = np.concatenate(frames)
    assert np.array_equal(out[: len(pcm)], pcm)  # nothing shed: the call starts at its first packet


def test_jitter_buffer_undoes_reordering_and_drops_duplicates(speech8k):
    pcm = speech8k[: 160 * 100]
    pk = _packets(pcm)
    shuffled = []
    for i in range(0, len(pk), 2):  # swap neighbours and send everything twice
        a, b = pk[i + 1], pk[i]
        shuffled += [a, a, b, b]
    jb = JitterBuffer(target_ms=60)
    out, _ = _play(jb, shuffled)
    assert np.array_equal(out[: len(pcm)], pcm)
    assert jb.stats.duplicate == 100 and jb.loss() == 0


def test_jitter_buffer_conceals_a_lost_packet_and_counts_it(speech8k):
    pcm = speech8k[: 160 * 50]
    pk = _packets(pcm)
    del pk[20]
    jb = JitterBuffer(target_ms=40)
    out, kinds = _play(jb, pk)
    assert kinds[20] is FrameKind.CONCEALED and jb.loss() == 1
    assert np.array_equal(out[: 20 * 160], pcm[: 20 * 160])
    assert np.array_equal(out[21 * 160 : 50 * 160], pcm[21 * 160 :])
    # The concealment fades the previous frame out instead of stopping dead.
    assert abs(int(out[21 * 160 - 1])) <= 1


def test_jitter_buffer_survives_sequence_and_timestamp_wrap(speech8k):
    pcm = speech8k[: 160 * 40]
    out, _ = _play(JitterBuffer(), _packets(pcm, seq0=65530, ts0=2**32 - 800))
    assert np.array_equal(out[: len(pcm)], pcm)


def test_jitter_buffer_reframes_30ms_packets_into_20ms_frames(speech8k):
    pcm = speech8k[: 240 * 40]
    out, _ = _play(JitterBuffer(target_ms=60), _packets(pcm, n=240), packet_ms=30)
    assert np.array_equal(out[: len(pcm)], pcm)


def test_jitter_buffer_resyncs_on_a_new_source_and_a_timestamp_jump(speech8k):
    a, b = speech8k[: 160 * 20], speech8k[160 * 20 : 160 * 40]
    jb = JitterBuffer(target_ms=40)
    arrivals = _packets(a) + _packets(b, seq0=9, ts0=123_456_789, ssrc=2)
    out, kinds = _play(jb, arrivals)
    assert jb.stats.resyncs >= 1 and jb.stats.samples_received == len(a) + len(b)
    assert kinds.count(FrameKind.AUDIO) == 40


def test_jitter_buffer_rides_over_a_timestamp_jump_and_sheds_a_burst(speech8k):
    a, b = speech8k[: 160 * 20], speech8k[160 * 20 : 160 * 40]
    jb = JitterBuffer(target_ms=40, max_ms=200)
    out, kinds = _play(jb, _packets(a) + _packets(b, seq0=120, ts0=5000 + 80_000))  # 10 s jump, same source
    assert kinds.count(FrameKind.AUDIO) == 40 and len(kinds) < 60  # no 10 s of silence inserted
    burst = JitterBuffer(target_ms=40, max_ms=200)
    _, kinds = _play(burst, _packets(speech8k[: 160 * 100]), packet_ms=0)  # a second of audio at once
    assert burst.stats.resyncs >= 1 and len(kinds) < 40  # latency is capped, not grown by the burst


def test_jitter_buffer_drops_late_packets(speech8k):
    jb = JitterBuffer(target_ms=20)
    pk = _packets(speech8k[: 160 * 10])
    jb.push(*pk[0])
    for _ in range(6):
        jb.pop()
    assert jb.push(*pk[1]) == "late"  # its playout time has passed
    assert jb.stats.late == 1
    assert jb.stats.grown == 0 and jb.target == 160  # a fixed buffer never grows


def test_adaptive_jitter_buffer_starts_shallow_and_grows_a_frame_per_late_packet(speech8k):
    pcm = speech8k[: 160 * 60]
    pk = _packets(pcm)
    # on time: it plays after one frame (20 ms), not after the 60 ms the fixed buffer waits
    out, kinds = _play(JitterBuffer(target_ms=60, min_ms=20), pk)
    assert np.array_equal(out[: len(pcm)], pcm) and kinds.count(FrameKind.AUDIO) == 60
    # packet 10 comes 40 ms late (the buffer holds 20: lost, +1 frame), packet 30 60 ms late
    # (40: lost, +1 frame), packet 45 80 ms late (60, the most: lost, no more growth)
    jb = JitterBuffer(target_ms=60, min_ms=20)
    delay = {10: 2, 30: 3, 45: 4}  # ticks late
    arrivals = sorted((i + delay.get(i, 0), i) for i in range(len(pk)))
    results, empty_ticks = {}, 0
    for tick in range(len(pk) + 10):
        while arrivals and arrivals[0][0] <= tick:
            i = arrivals.pop(0)[1]
            results[i] = jb.push(*pk[i])
        empty_ticks += jb.pop() is None
    assert [i for i, r in results.items() if r == "late"] == [10, 30, 45]
    assert jb.stats.grown == 2 and jb.target == jb.target_limit == 480  # 20 -> 60 ms, and no further
    assert empty_ticks == 3  # the first frame's tick and one per growth: the timeline has no hole


# --- DTMF ---


def test_dtmf_from_sipps_recorded_rfc4733_packets():
    rx = DtmfReceiver()
    digits = []
    for p in read_rtp_pcap(SIPP_PCAPS / "dtmf_2833_1.pcap"):
        digits += rx.push(p.ssrc, p.timestamp, p.payload, now=0.0)
    assert [(d.digit, d.duration_ms) for d in digits] == [("1", 280)]  # three end packets, one digit


def test_dtmf_digit_is_reported_when_its_end_packets_are_lost():
    rx = DtmfReceiver(timeout_s=1.0)
    assert rx.push(7, 800, build_event(11, False, 400), now=0.0) == []
    assert rx.poll(now=0.5) == []
    assert [d.digit for d in rx.poll(now=1.6)] == ["#"]
    assert [d.digit for d in rx.push(7, 1600, build_event(5, False, 160), now=2.0)] == []
    assert [d.digit for d in rx.push(7, 2400, build_event(6, True, 160), now=2.1)] == ["5", "6"]  # new event ends 5


def test_dtmf_info_bodies():
    assert parse_info_body("application/dtmf-relay", "Signal=5\r\nDuration=160\r\n").digit == "5"
    assert parse_info_body("application/dtmf-relay", "Signal=10\r\nDuration=100\r\n").digit == "*"
    assert parse_info_body("application/dtmf", "#").digit == "#"
    for ctype, body in [("application/dtmf-relay", "Duration=1"), ("application/dtmf-relay", "Signal=Z"),
                        ("text/plain", "5"), ("application/dtmf-relay", "Signal=1\nDuration=99999999")]:  # fmt: skip
        with pytest.raises(DtmfError):
            parse_info_body(ctype, body)


# --- the agent's audio output and the sender ---


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


def _drain(out: RtpAudioOutput) -> tuple[list[np.ndarray | None], list[bool]]:
    frames, starts = [], []
    for _ in range(10_000):
        pcm, start = out.next_frame()
        frames.append(pcm)
        starts.append(start)
        if pcm is None:
            break
    return frames, starts


def test_output_concatenates_tts_chunks_without_seams(speech8k):
    """Packets are cut from one sample stream: no padding or gap where one chunk meets the next."""
    out = RtpAudioOutput(FakeClock())
    pcm, i = speech8k[: 8000 * 3], 0
    for size in [37, 1000, 333, 160, 4001, 2, 7, 999]:
        out.play(pcm[i : i + size])
        i += size
    out.play(pcm[i:])
    frames, starts = _drain(out)
    sent = np.concatenate([f for f in frames if f is not None])
    assert np.array_equal(sent[: len(pcm) - 40], pcm[: len(pcm) - 40])  # all but the 5 ms end fade
    assert starts[0] and not any(starts[1:])  # one talk spurt, marked once


def test_output_fades_out_at_the_end_and_on_barge_in(speech8k):
    clock = FakeClock()
    out = RtpAudioOutput(clock)
    loud = np.full(1000, 20000, dtype=np.int16)  # the worst case: audio ends at full scale
    out.play(loud)
    frames, _ = _drain(out)
    assert frames[-2][1000 - 6 * 160 - 1] == 0  # the last sample before padding is silent
    out.begin_turn(3)
    out.play(speech8k[:16000])
    for _ in range(10):
        out.next_frame()
    heard = out.interrupt()
    assert heard == pytest.approx(10 * 160 / 8000)
    tail, _ = out.next_frame()
    assert tail is not None and np.all(np.abs(tail[39:]) <= 1)  # 5 ms fade, then nothing
    assert out.next_frame() == (None, False)


def test_output_timing_reports_when_audio_reaches_the_caller():
    clock = FakeClock()
    out = RtpAudioOutput(clock)
    clock.t = 5.0
    assert out.busy_until() <= clock.now()  # idle output is not "audible"
    out.set_next_send(5.01)
    assert out.play(np.zeros(800, np.int16)) == pytest.approx(5.01)
    assert out.busy_until() == pytest.approx(5.11)
    assert out.play(np.zeros(800, np.int16)) == pytest.approx(5.11)


class FakeSocket:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, tuple[str, int]]] = []

    def sendto(self, data: bytes, addr: tuple[str, int]) -> None:
        self.sent.append((data, addr))


def test_sender_numbers_packets_marks_spurts_and_stays_quiet_on_hold(speech8k):
    out = RtpAudioOutput(FakeClock())
    sock = FakeSocket()
    plan = MediaPlan(PCMU, 0, 101, "127.0.0.1", 4000, "sendrecv")
    sender = RtpSender(sock, out, plan)  # type: ignore[arg-type]
    sender.tick(0.0, 0.02)  # silence: first packet of the stream carries the marker
    out.play(speech8k[:480])
    for _ in range(4):
        sender.tick(0.0, 0.02)
    sender.update(MediaPlan(PCMU, 0, 101, "127.0.0.1", 4000, "recvonly"))  # the caller put us on hold
    for _ in range(3):
        sender.tick(0.0, 0.02)
    sender.update(plan)
    sender.tick(0.0, 0.02)
    packets = [RtpPacket.parse(d) for d, _ in sock.sent]
    assert len(packets) == 6
    assert [p.marker for p in packets] == [True, True, False, False, False, True]
    assert [seq_delta(packets[0].seq, p.seq) for p in packets] == [0, 1, 2, 3, 4, 5]
    assert [ts_delta(packets[0].timestamp, p.timestamp) // 160 for p in packets] == [0, 1, 2, 3, 4, 8]
    assert PCMU.decode(packets[1].payload).tolist() == PCMU.decode(PCMU.encode(speech8k[:160])).tolist()
