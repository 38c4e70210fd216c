"""The torch Whisper decoder that checks a draft (the previous hypothesis) in one pass."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from tests import speech
from tests.wer import wer
from voice.asr import StreamingASR, TranscriptResult, default_model_path
from voice.audio import read_wav
from voice.whisper_decoder import _looping, _realign, read_ct2_variables

LEAD = np.zeros(3200, np.float32)  # the session's pre-roll


def _audio(clip: speech.Clip) -> np.ndarray:
    return np.concatenate([LEAD, read_wav(clip.path, 16000)[0].astype(np.float32) / 32768])


def test_reads_the_shipped_ctranslate2_weights() -> None:
    w = read_ct2_variables(default_model_path() / "model.bin")
    assert w["decoder/embeddings/weight"].shape == (51864, 384)
    assert w["decoder/projection/weight"] is w["decoder/embeddings/weight"]  # the alias
    assert not any(k.startswith("encoder/") for k in w)


def test_a_file_that_is_not_a_ctranslate2_model_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "model.bin"
    bad.write_bytes(struct.pack("I", 2) + b"\x00" * 16)
    with pytest.raises(ValueError, match="version 2"):
        read_ct2_variables(bad)
    bad.write_bytes(b"\x06\x00")
    with pytest.raises(struct.error):
        read_ct2_variables(bad)


def test_loop_guard_and_realignment() -> None:
    assert _looping([5, 1, 2, 1, 2, 1, 2]) and _looping([7, 7, 7])
    assert not _looping([1, 2, 1, 2, 3]) and not _looping([1, 2])
    draft = [10, 11, 12, 13, 14]
    assert _realign(draft, 2, [99, 12]) == 2  # a token added before the expected one
    assert _realign(draft, 2, [99, 13]) == 3  # the expected token swapped or dropped
    assert _realign(draft, 0, [11, 13, 14]) == 4  # later, after the same token as in the text
    assert _realign(draft, 0, [50, 51]) is None


@pytest.fixture(scope="module")
def asr():
    from pipelines.config import AsrConfig
    from voice.asr import WhisperEngine

    return WhisperEngine(AsrConfig(draft_decoder=True, workers=1))


@pytest.mark.slow
def test_draft_is_checked_in_one_pass_and_never_leaks_into_the_text(asr) -> None:
    assert asr.drafts
    errs_ct2, errs_draft, cheap = [], [], 0
    for clip in speech.librivox():
        audio = _audio(clip)
        asr.draft_decoder, saved = None, asr.draft_decoder  # CTranslate2's decoder alone
        try:
            plain = asr.transcribe(audio)
            partial = asr.transcribe(audio[: len(audio) - 6400])  # a partial 0.4 s before the end
        finally:
            asr.draft_decoder = saved
        drafted = asr.transcribe(audio, draft=partial.text)
        errs_ct2.append(wer(clip.text, plain.text))
        errs_draft.append(wer(clip.text, drafted.text))
        cheap += drafted.drafted >= 0.6 * len(asr.tokenizer.encode(" " + partial.text))
        # a draft of other words is checked and thrown away: the text is the audio's
        wrong = asr.transcribe(audio, draft="Please hold the line while I check the weather in Paris.")
        assert wer(clip.text, wrong.text) <= wer(clip.text, plain.text) + 0.1, (wrong.text, plain.text)
        assert wrong.drafted <= 2
    assert cheap >= 4  # most of each partial's tokens came without a decoder step of their own
    assert float(np.mean(errs_draft)) <= float(np.mean(errs_ct2)) + 0.03, (errs_draft, errs_ct2)


@pytest.mark.slow
def test_a_draft_never_sends_a_transcription_to_the_30_s_window(asr) -> None:
    """Where the torch decoder's near-tie choices run into a loop that CTranslate2's greedy
    pass does not (on this CPU: "he was not an old-s-y-y-y" for the second clip without
    its pre-roll), the same encoder output is decoded again by CTranslate2: the result is
    CTranslate2's, never the 30 s window's (~0.6 s)."""
    for clip in speech.librivox():
        raw = read_wav(clip.path, 16000)[0].astype(np.float32) / 32768
        for audio in (raw, np.concatenate([LEAD, raw])):
            asr.draft_decoder, saved = None, asr.draft_decoder
            try:
                plain = asr.transcribe(audio)
                drafts = {asr.transcribe(audio[: len(audio) - cut]).text for cut in (3200, 6400, 9600)}
            finally:
                asr.draft_decoder = saved
            for draft in drafts:
                drafted = asr.transcribe(audio, draft=draft)
                assert drafted.window_s == plain.window_s, (clip.path.name, draft, drafted.text, plain.text)
                assert wer(clip.text, drafted.text) <= wer(clip.text, plain.text) + 0.1, (drafted.text, plain.text)


class FakeDraftTranscriber:
    """A fake engine (this test isolates the streaming policy): records the drafts it is
    handed and answers a word per second of audio."""

    def __init__(self) -> None:
        self.drafts: list[str | None] = []

    def __call__(self, audio: np.ndarray, draft: str | None = None) -> TranscriptResult:
        self.drafts.append(draft)
        return TranscriptResult(" ".join(["word"] * (len(audio) // 16000)), 0.0, 8.0)


async def test_each_hypothesis_gets_the_newest_one_of_its_audio_as_draft() -> None:
    fake = FakeDraftTranscriber()
    s = StreamingASR(fake, drafts=True)
    s.reset(0.0)
    s.insert_audio(np.zeros(8000, np.int16))
    await s.process_iter()  # no words: no draft for the next one
    s.insert_audio(np.zeros(16000 * 3, np.int16))
    await s.process_iter()
    s.insert_audio(np.zeros(16000 * 4, np.int16))
    await s.process_iter()
    assert fake.drafts == [None, None, "word word word"]
    assert s.fix_prefix(min_new_s=6.0)  # cut: the audio after it has no hypothesis yet
    s.insert_audio(np.zeros(16000 * 2, np.int16))
    await s.process_iter()
    s.insert_audio(np.zeros(16000, np.int16))
    await s.finish()
    assert fake.drafts[3:] == [None, "word word"]
    s.reset(20.0)  # a new utterance starts without one
    s.insert_audio(np.zeros(16000, np.int16))
    await s.process_iter()
    assert fake.drafts[-1] is None
