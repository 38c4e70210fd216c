"""VAD, streaming ASR and TTS on real recorded speech."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from pipelines.config import AsrConfig
from tests import speech
from tests.wer import wer
from voice.asr import StreamingASR, WhisperEngine, agreed_prefix, deloop, looks_degenerate, said_twice
from voice.audio import AudioFrame, frames_of, read_wav, resample
from voice.transports.sip.g711 import PCMU
from voice.vad import VadSegmenter, WebRtcVad

ASR_WER_BOUND = 0.25  # tiny.en int8 on these clips; measured 0.05-0.15


def _segment(pcm: np.ndarray, rate: int = 16000) -> list:
    seg = VadSegmenter(WebRtcVad(2, rate, 20), start_ms=60, stop_ms=300)
    events = []
    for f in frames_of(pcm, rate, 20):
        events += [e for e in seg.process(f) if e.kind in ("start", "pause")]
    return events


def test_vad_finds_each_utterance_in_a_real_multi_turn_signal() -> None:
    clips = speech.librivox()[:3]
    gap = np.zeros(16000 * 2, dtype=np.int16)
    parts, bounds, t = [gap], [], 2.0
    for c in clips:
        pcm, _ = read_wav(c.path, 16000)
        parts += [pcm, gap]
        bounds.append((t, t + len(pcm) / 16000))
        t += len(pcm) / 16000 + 2.0
    events = _segment(np.concatenate(parts))
    starts = [e.t for e in events if e.kind == "start"]
    pauses = [e.t for e in events if e.kind == "pause"]
    # every utterance starts inside its bounds, and the last pause of each is near its end
    for lo, hi in bounds:
        assert any(lo - 0.1 <= s <= hi for s in starts)
        assert any(hi - 0.8 <= p <= hi + 0.1 for p in pauses)
    assert not any(b[1] + 0.2 < s < b[1] + 1.8 for b in bounds for s in starts)  # silence stays silent


def test_vad_rejects_wrong_rate() -> None:
    seg = VadSegmenter(WebRtcVad(2, 16000, 20))
    with pytest.raises(ValueError, match="16000"):
        seg.process(AudioFrame(np.zeros(160, np.int16), 8000, 0.0))
    with pytest.raises(ValueError):
        WebRtcVad(2, 22050, 20)


@pytest.mark.slow
@pytest.mark.parametrize("window", [30.0, 8.0, None])  # None: the adaptive window
def test_asr_wer_on_real_speech(engines, window: float | None) -> None:
    clips = [speech.jfk(), *speech.librivox()]
    errs = []
    for c in clips:
        pcm, _ = read_wav(c.path, 16000)
        res = engines.asr.transcribe(pcm.astype(np.float32) / 32768, window_s=window)
        errs.append(wer(c.text, res.text))
    assert float(np.mean(errs)) <= ASR_WER_BOUND, errs


@pytest.mark.slow
def test_a_window_whisper_calls_no_speech_gives_no_words(engines) -> None:
    # The first 0.3 s of each LibriVox clip (a breath, a syllable) came back as "and", ".",
    # "Yeah." with no-speech probabilities of 0.89-0.98; faster-whisper's own rule drops those,
    # while every whole clip, the card answers included, keeps its words.
    lead = np.zeros(3200, np.float32)  # the session's pre-roll
    for c in speech.librivox():
        pcm = read_wav(c.path, 16000)[0].astype(np.float32) / 32768
        onset = engines.asr.transcribe(np.concatenate([lead, pcm[: int(0.3 * 16000)]]))
        assert onset.text == "" and onset.no_speech_prob > 0.6, (c.path.name, onset)
    for c in [*speech.librivox(), *speech.cards()]:
        pcm = read_wav(c.path, 16000)[0].astype(np.float32) / 32768
        assert engines.asr.transcribe(np.concatenate([lead, pcm])).text, c.path.name


@pytest.mark.slow
def test_a_short_word_on_a_phone_line_is_not_taken_for_no_speech(engines) -> None:
    # "semicolon" (1.3 s, 0.9 s of it sound) through the 8 kHz band with G.711 and a line's
    # noise floor: the fitted 3 s window calls it no speech (0.70-0.87), the 30 s window's
    # second look hears the word (under 0.15); the line's noise alone stays no words.
    rng = np.random.default_rng(0)

    def line(x: np.ndarray) -> np.ndarray:
        x = x + rng.standard_normal(len(x)) * 32768 * 10 ** (-57 / 20)
        tel = PCMU.decode(PCMU.encode(np.clip(np.round(x), -32768, 32767).astype(np.int16)))
        return resample(tel, 8000, 16000).astype(np.float32) / 32768

    word = line(np.concatenate([np.zeros(1200), read_wav(speech.allison("letters/ascii59"), 8000)[0]]))
    without = WhisperEngine(AsrConfig(second_look=False))
    assert without.transcribe(word).text == ""
    heard = engines.asr.transcribe(word)
    assert "semi" in heard.text.lower() and heard.no_speech_prob < 0.5, heard
    assert engines.asr.transcribe(line(np.zeros(8000))).text == ""
    # a partial nobody waits on skips the 30 s window: no words yet, marked provisional
    quick = engines.asr.transcribe(word, thorough=False)
    assert quick.text == "" and quick.provisional and quick.window_s < 30.0, quick


def test_adaptive_window_fits_the_audio(engines) -> None:
    asr = engines.asr
    cfg = asr.cfg  # defaults: min 3 s, margin 1 s, cap 8 s
    assert asr.window_for(0.5) == cfg.min_window_s == 3.0
    assert asr.window_for(2.5) == 4.0  # the smallest whole second with ≥ 1 s of silence after
    assert asr.window_for(6.5) == 8.0  # capped at window_s
    assert asr.window_for(7.9) == 9.0  # longer than the cap: still fitted
    assert asr.window_for(2.5, min_window_s=cfg.twice_window_s) == 8.0  # the window a doubled text is decoded on
    assert asr.window_for(20.0) == 21.0
    assert asr.window_for(28.5) == 30.0
    assert asr.window_for(11.0, window_s=8.0) == 16.0  # an explicit window too short: the next one up
    assert asr.window_for(2.5, window_s=8.0) == 8.0  # an explicit window is used as asked
    assert asr.window_for(2.5, window_s=30.0) == 30.0


def test_said_twice_finds_a_run_of_words_said_again_at_once() -> None:
    assert said_twice("November. November") and said_twice("go forward 10 meters. Go forward 10 meters.")
    assert said_twice("five five")  # said so, or not: the longer window decides
    assert not said_twice("Your temporary greeting has been removed.") and not said_twice("")
    assert not said_twice("ten of clubs, seven of clubs")


@pytest.mark.slow
def test_asr_on_8khz_telephone_speech(engines) -> None:
    pcm, rate = read_wav(speech.hello_8k())
    assert rate == 8000
    res = engines.asr.transcribe(resample(pcm, 8000, 16000).astype(np.float32) / 32768)
    assert len(res.text.split()) >= 3  # real speech is recognised as words (no reference transcript)


def test_deloop_keeps_one_period_of_a_loop() -> None:
    assert deloop("10 of clubs 10 of clubs 10 of clubs 10 of") == "10 of clubs"
    assert deloop("I said ten of clubs, ten of clubs, ten of clubs") == "I said ten of clubs"
    assert deloop("hello there, how are you") is None  # no loop: nothing to cut
    # a loop that ended short of the guard's third round (a real partial of "10 of clubs",
    # 1.06 s of audio in a 3 s window): cut back; a word or a phrase said again stays
    assert deloop("10 of clubs. 10 of clubs. 10", min_period=2) == "10 of clubs."
    for said in ("no no no", "bye bye bye", "thank you thank you", "I said ten of clubs ten of clubs"):
        assert deloop(said, min_period=2) is None, said
    assert deloop("") is None


def test_degeneracy_guard() -> None:
    assert looks_degenerate("I hope you I hope you I hope you", 2.0)
    assert looks_degenerate(" ".join(["word"] * 40), 2.0)
    assert not looks_degenerate("ask not what your country can do for you", 3.0)


def test_local_agreement_prefix() -> None:
    assert agreed_prefix("He was not an".split(), "He was not an ill".split()) == 4
    assert agreed_prefix("like your".split(), "What your".split()) == 0


class FakeTranscriber:
    """Scripted hypotheses: isolates the streaming policy from Whisper."""

    def __init__(self, hyps: list[str]) -> None:
        self.hyps = hyps
        self.calls = 0

    def __call__(self, audio: np.ndarray):
        from voice.asr import TranscriptResult

        text = self.hyps[min(self.calls, len(self.hyps) - 1)]
        self.calls += 1
        return TranscriptResult(text, 0.0, 8.0)


class FakeLengthTranscriber:
    """Names the audio it was given by its length, to show what the policy transcribes."""

    def __init__(self) -> None:
        self.lengths: list[int] = []

    def __call__(self, audio: np.ndarray):
        from voice.asr import TranscriptResult

        self.lengths.append(len(audio))
        return TranscriptResult(f"words{len(audio) // 16000}.", 0.0, 8.0)


class FakeQuickTranscriber:
    """A fake engine (this test isolates the streaming policy): without ``thorough`` it gives
    a provisional no-words result, as WhisperEngine does where only the 30 s window would hear
    the word; records which way each call ran."""

    def __init__(self) -> None:
        self.thorough: list[bool] = []

    def __call__(self, audio: np.ndarray, thorough: bool = True):
        from voice.asr import TranscriptResult

        self.thorough.append(thorough)
        if not thorough:
            return TranscriptResult("", 0.0, 3.0, provisional=True)
        return TranscriptResult("Semicolon.", 0.0, 30.0)


async def test_a_partial_ahead_of_need_is_quick_and_a_waited_hypothesis_decodes_it_again() -> None:
    from voice.workers import AHEAD

    fake = FakeQuickTranscriber()
    s = StreamingASR(fake, quick_partials=True)
    s.reset(0.0)
    s.insert_audio(np.zeros(16000, np.int16))
    u = await s.process_iter(AHEAD)
    assert u.partial == "" and s.peek_cached() is None  # provisional: not the hypothesis of this audio
    assert (await s.finish()).partial == "Semicolon."  # the same audio, now thoroughly
    assert fake.thorough == [False, True]
    assert s.peek_cached() == "Semicolon."
    assert (await s.process_iter(AHEAD)).partial == "Semicolon."  # a thorough result serves both
    assert fake.thorough == [False, True]
    plain = FakeQuickTranscriber()
    s = StreamingASR(plain)  # an engine that does not take thorough=: always thorough
    s.reset(0.0)
    s.insert_audio(np.zeros(16000, np.int16))
    assert (await s.process_iter(AHEAD)).partial == "Semicolon." and plain.thorough == [True]


async def _three_seconds_transcribed(fake: FakeLengthTranscriber) -> StreamingASR:
    s = StreamingASR(fake)
    s.reset(0.0)
    s.insert_audio(np.zeros(16000 * 3, np.int16))
    await s.process_iter()
    return s


async def test_long_utterance_is_cut_at_a_pause_and_only_the_rest_is_transcribed() -> None:
    fake = FakeLengthTranscriber()
    s = await _three_seconds_transcribed(fake)
    assert not s.fix_prefix(min_new_s=6.0)  # too short to cut
    s.insert_audio(np.zeros(16000 * 4, np.int16))
    assert not s.fix_prefix(min_new_s=6.0)  # no hypothesis of exactly this audio yet
    u = await s.process_iter()
    assert u.partial == "words7." and s.fix_prefix(min_new_s=6.0)
    s.insert_audio(np.zeros(16000 * 2, np.int16))
    u = await s.process_iter()
    assert fake.lengths == [16000 * 3, 16000 * 7, 16000 * 2]  # the last call saw only the new audio
    assert u.partial == "words7. words2."
    assert (await s.finish()).partial == "words7. words2."
    s.reset(10.0)  # a new utterance starts uncut
    s.insert_audio(np.zeros(16000, np.int16))
    assert (await s.process_iter()).partial == "words1."


async def test_cut_refused_at_a_pause_falls_at_the_last_pause_that_allowed_it() -> None:
    fake = FakeLengthTranscriber()
    s = await _three_seconds_transcribed(fake)
    assert not s.fix_prefix(min_new_s=6.0, where=lambda text: text == "words3.")  # short: remembered
    s.insert_audio(np.zeros(16000 * 4, np.int16))
    await s.process_iter()
    assert s.fix_prefix(min_new_s=6.0, where=lambda text: text == "words3.")  # refused here: cut at 3 s
    s.insert_audio(np.zeros(16000, np.int16))
    u = await s.process_iter()
    assert fake.lengths[-1] == 16000 * 5 and u.partial == "words3. words5."


async def test_a_cut_made_while_an_older_hypothesis_runs_does_not_prefix_it() -> None:
    release = threading.Event()
    fake = FakeLengthTranscriber()

    def gated(audio: np.ndarray):
        if len(audio) == 16000 * 4:  # the older hypothesis waits until the newer one has cut
            release.wait(5)
        return fake(audio)

    s = StreamingASR(gated)
    s.reset(0.0)
    s.insert_audio(np.zeros(16000 * 4, np.int16))
    older = asyncio.ensure_future(s.process_iter())
    await asyncio.sleep(0.05)
    s.insert_audio(np.zeros(16000 * 3, np.int16))
    assert (await s.process_iter()).partial == "words7."
    assert s.fix_prefix(min_new_s=6.0)
    release.set()
    assert (await older).partial == "words4."  # its audio starts at 0, not at the cut


async def test_streaming_policy_local_agreement_and_cached_final() -> None:
    fake = FakeTranscriber(["he was", "he was not an", "he was not an ill disposed man"])
    s = StreamingASR(fake)
    s.reset(0.0)
    s.insert_audio(np.zeros(3200, np.int16))
    u1 = await s.process_iter()
    s.insert_audio(np.zeros(3200, np.int16))
    u2 = await s.process_iter()
    assert u1.stable == "" and u2.stable == "he was"
    s.insert_audio(np.zeros(3200, np.int16))
    u3 = await s.process_iter()
    assert u3.stable == "he was not an"
    final = await s.finish()  # no new audio: the last hypothesis is the final, no new call
    assert final.partial == "he was not an ill disposed man" and fake.calls == 3


@pytest.mark.slow
def test_tts_streams_first_clause_and_round_trips_through_asr(engines) -> None:
    tts = engines.tts
    text = "Thanks for calling the help desk, my name is Joe. How can I help you today?"
    parts = tts.split(text)
    assert len(parts[0].split()) <= tts.cfg.max_first_words and len(parts) >= 3
    audio = np.concatenate(list(tts.synthesize_chunks(text)))
    assert tts.sample_rate == 22050 and len(audio) > tts.sample_rate
    back = engines.asr.transcribe(resample(audio, tts.sample_rate, 16000).astype(np.float32) / 32768, window_s=30)
    assert wer(text, back.text) <= 0.2, back.text


def test_tts_reuses_a_clause_it_has_said_and_nobody_can_change_it(engines) -> None:
    tts = engines.tts
    clause = "Could you say that again, please?"
    first = tts.synth(clause)
    hits = tts.cache_hits
    again = tts.synth(clause)
    assert tts.cache_hits == hits + 1 and np.array_equal(first, again) and len(again) > tts.sample_rate // 2
    with pytest.raises(ValueError):
        again[0] = 1  # shared between turns: read-only


@pytest.mark.slow
async def test_tts_stream_is_cancellable(engines) -> None:
    got = []

    async def consume() -> None:
        async for pcm in engines.tts.stream("One. Two. Three. Four. Five. Six. Seven. Eight."):
            got.append(pcm)
            await asyncio.sleep(0)

    task = asyncio.create_task(consume())
    while not got:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert 1 <= len(got) < 8


def test_asr_missing_model_is_a_clear_error(tmp_path) -> None:
    from voice.asr import AsrLoadError, WhisperEngine

    with pytest.raises(AsrLoadError, match="no CTranslate2 Whisper model"):
        WhisperEngine(AsrConfig(model_path=str(tmp_path)))


def test_level_gate_ends_speech_where_the_sound_ends_not_after_webrtcvads_hangover() -> None:
    """Real speech with a line hiss 30 dB under it: webrtcvad alone hears the hiss as voice for
    a while after the last word; gated, the last voiced frame ends near the true end."""
    from tests.ground_truth import speech_end
    from voice.level import LevelGate

    rng = np.random.default_rng(0)
    late = []
    for clip in speech.librivox():
        pcm, _ = read_wav(clip.path, 16000)
        x = np.concatenate([np.zeros(8000, np.int16), pcm, np.zeros(16000, np.int16)]).astype(np.float64)
        true_end = 0.5 + speech_end(pcm, 16000)
        hiss = rng.normal(0, 1, len(x))
        hiss *= np.sqrt((pcm.astype(np.float64) ** 2).mean()) / 10 ** (30 / 20) / hiss.std()
        noisy = np.clip(x + hiss, -32768, 32767).astype(np.int16)

        def last_voiced(gate: LevelGate | None, noisy: np.ndarray = noisy) -> float:
            seg = VadSegmenter(WebRtcVad(2, 16000, 20), 60, 80, gate)
            for f in frames_of(noisy, 16000, 20):
                seg.process(f)
            return seg.last_voiced_end

        gated, plain = last_voiced(LevelGate(40.0)), last_voiced(None)
        # the ruler also gates the clip's own room tone, 10 dB over its floor: a soft tail
        # above the line's hiss may still count for the VAD
        assert true_end - 0.03 <= gated <= true_end + 0.2, (clip.path.name, true_end, gated)
        assert gated <= plain + 1e-9
        late.append((gated - true_end, plain - true_end))
    assert np.mean([g for g, _ in late]) < np.mean([p for _, p in late]) - 0.05, late


def test_level_gate_in_background_noise_does_not_end_speech_early() -> None:
    """Real speech under pink noise at 25 and 15 dB SNR, with `vad.noise_margin_share` 0.2: the
    gate's margin over the noise floor shrinks with the line's range, so the caller's last soft
    syllables still count as speech and the pause does not start before the true end (the fixed
    10 dB margin started it up to 70 ms early at 15 dB), nor long after it."""
    from bench.eval_calls import _pink
    from tests.ground_truth import speech_end
    from voice.level import LevelGate, frame_db

    rng = np.random.default_rng(0)
    for clip in speech.librivox():
        pcm, _ = read_wav(clip.path, 16000)
        x = np.concatenate([np.zeros(8000, np.int16), pcm, np.zeros(16000, np.int16)]).astype(np.float64)
        true_end = 0.5 + speech_end(pcm, 16000)
        db = frame_db(pcm, 16000)
        active = np.mean(10 ** (db[db >= db.max() - 35] / 10))  # mean power of the audible frames
        for snr in (25, 15):
            noisy = x + _pink(len(x), rng) * np.sqrt(active) * 10 ** (-snr / 20)
            seg = VadSegmenter(WebRtcVad(2, 16000, 20), 60, 80, LevelGate(40.0, noise_share=0.2))
            for f in frames_of(np.clip(noisy, -32768, 32767).astype(np.int16), 16000, 20):
                seg.process(f)
            assert true_end - 0.02 <= seg.last_voiced_end <= true_end + 0.2, (clip.path.name, snr, true_end,
                                                                              seg.last_voiced_end)


def test_tts_clause_starts_with_sound_not_dead_air(engines) -> None:
    """Piper's own lead-in (30-50 ms under -40 dB of the peak) is cut: the caller hears the
    reply within 20 ms of its first sample."""
    from voice.level import first_audible_offset

    tts = engines.tts
    for clause in ("Sure.", "How can I help you today?", "Let me check that order for you."):
        pcm = tts.synth(clause)
        assert first_audible_offset(pcm, tts.sample_rate) <= 0.02, clause
        assert abs(int(pcm[0])) < 2000  # faded in: no click at the cut
