"""The turn-taking evaluation set of real speech (bench/eval_calls.py, docs/eval_set.md)."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from bench import eval_calls as ec

KINDS = ("pause", "join", "short", "sentence")
FS = ec.RATE


@pytest.fixture(scope="module")
def calls() -> dict[str, list[dict]]:
    try:
        return {s: ec.load_calls(s) for s in ec.SPLITS}
    except FileNotFoundError as exc:
        pytest.fail(f"{exc} (make setup)")


@pytest.fixture(scope="module")
def clean() -> dict[str, list[dict]]:
    return {s: ec.clean_calls(s) for s in ec.SPLITS}


def _db(x: np.ndarray, a: float, b: float) -> float:
    seg = x[int(round(a * FS)): int(round(b * FS))]
    return float(20 * np.log10(np.sqrt(np.mean(seg * seg)) + 1e-9))


def test_size_speakers_and_split(calls):
    every = calls["dev"] + calls["test"]
    turns = [t for c in every for t in c["truth"]["turns"]]
    assert len(every) >= 40 and len(turns) >= 120
    assert len({t["speaker"] for t in turns}) >= 6
    test_turns = [t for c in calls["test"] for t in c["truth"]["turns"]]
    assert len(calls["test"]) >= 20 and len(test_turns) >= 60
    src = {s: {u for c in calls[s] for t in c["truth"]["turns"] for u in t["sources"]} for s in ec.SPLITS}
    assert not src["dev"] & src["test"]
    for s in ec.SPLITS:
        ts = [t for c in calls[s] for t in c["truth"]["turns"]]
        kinds = [t["kind"] for t in ts]
        for k in KINDS:
            assert kinds.count(k) >= 10, (s, k)
        pauses = [p["kind"] for t in ts for p in t["pauses"]]
        for k in ("function", "content", "join"):
            assert pauses.count(k) >= 5, (s, k)
        assert {c["truth"]["codec"] for c in calls[s]} == {"none", "pcmu"}
        assert any(c["truth"]["noise_snr_db"] == 25.0 for c in calls[s])


def test_files_match_truth(calls):
    for c in calls["dev"][:4] + calls["test"][:4]:
        info = sf.info(c["wav"])
        assert info.samplerate == c["rate"] == (8000 if c["truth"]["codec"] == "pcmu" else 16000)
        assert info.channels == 1 and info.subtype == "PCM_16"
        turns = c["truth"]["turns"]
        assert 3 <= len(turns) <= 4 and turns[0]["start_s"] >= ec.LEAD_IN_S
        assert turns[-1]["end_s"] + 3.4 < info.duration
        for a, b in zip(turns, turns[1:], strict=False):
            assert b["start_s"] - a["end_s"] >= 3.4


def test_truth_on_clean_audio(calls, clean):
    """Ends lie on audible speech; inserted pauses are silent in the clean source, and a
    mid-sentence cut lies at a quiet point (not inside a word)."""
    for s in ec.SPLITS:
        assert [c["truth"] for c in clean[s]] == [c["truth"] for c in calls[s]]  # the cache is this build
        for c in clean[s]:
            x, tr = c["clean"], c["truth"]
            floor = tr["noise_floor_dbfs"] + 90.31  # on the int16 scale
            for t in tr["turns"]:
                peak = max(_db(x, a, a + 0.01) for a in np.arange(t["start_s"], t["end_s"], 0.01))
                gate = t["gate_dbfs"] + 90.31
                assert gate >= peak - ec.FLOOR_DB - 0.1
                last = _db(x, t["end_s"] - 0.01, t["end_s"])
                assert last >= gate - 0.1 and last >= floor + 3, (c["id"], t)
                assert _db(x, t["start_s"], t["start_s"] + 0.01) >= gate - 0.1
                assert all(_db(x, a, a + 0.01) < gate + 0.1
                           for a in np.arange(t["end_s"], t["end_s"] + 1.0, 0.01)), (c["id"], t)
                for p in t["pauses"]:
                    if p["kind"] == "natural":  # the speaker's own: quiet under the gate throughout
                        assert p["end_s"] - p["start_s"] >= ec.NATURAL_PAUSE_S - 1e-6
                        assert all(_db(x, a, a + 0.01) < gate + 0.1
                                   for a in np.arange(p["start_s"], p["end_s"] - 0.005, 0.01)), (c["id"], p)
                        continue
                    assert 0.2 <= p["end_s"] - p["start_s"] <= 0.8 + 1e-6
                    assert _db(x, p["start_s"], p["end_s"]) < floor + 10, (c["id"], p)
                    if p["kind"] != "join":
                        assert p["end_s"] - p["start_s"] >= 0.4 - 1e-6
                        assert _db(x, p["start_s"] - 0.01, p["start_s"]) <= peak - 15, (c["id"], p)
                        assert _db(x, p["end_s"], p["end_s"] + 0.01) <= peak - 15, (c["id"], p)


def test_ruler_finds_where_the_caller_resumes(clean):
    """Where the caller is audible again after an inserted pause, by the turn's own gate: at or
    after the pause's end and inside the turn (an inserted pause may run on into the
    speaker's own silence, as JFK's "fellow Americans ... ask not" does)."""
    from tests.ground_truth import levels_dbfs, loud_from

    for c in clean["dev"]:
        levels = levels_dbfs(c["clean"], FS)
        for t in c["truth"]["turns"]:
            for p in t["pauses"]:
                back = loud_from(levels, p["end_s"], t["gate_dbfs"])
                assert back is not None and p["end_s"] - 0.01 <= back < t["end_s"], (c["id"], p, back)


def test_ruler_finds_where_agent_speech_stops(engines) -> None:
    """`audible_until` follows the agent's voice (Piper, clause by clause) through its short
    pauses to its last audible sound."""
    from tests.ground_truth import audible_onsets, audible_until, speech_end
    from voice.audio import resample

    tts = engines.tts
    voice = np.concatenate(list(tts.synthesize_chunks("Sure, I can help. What is the order number?")))
    pcm = resample(voice, tts.sample_rate, FS)
    track = np.concatenate([np.zeros(FS, np.int16), pcm, np.zeros(FS, np.int16)])
    onset = audible_onsets(track, FS)[0]
    assert audible_until(track, FS, onset) == pytest.approx(speech_end(track, FS), abs=0.03)
    assert audible_until(track, FS, 0.2) == 0.2  # nothing audible from there on for 0.8 s


def test_stress_variant_puts_noise_on_every_call_and_keeps_the_truth(clean):
    """``snr``: pink noise at that SNR on every call of the split; the calls, their truth and
    their clean tracks stay the set's own, so a bench run on it is judged by the same ruler."""
    noisy = ec._calls("dev", ec.sources(), snr=15.0)
    assert [c["id"] for c in noisy] == [c["id"] for c in clean["dev"]]
    for n, c in zip(noisy, clean["dev"], strict=True):
        assert n["truth"]["noise_snr_db"] == 15.0
        assert n["truth"]["turns"] == c["truth"]["turns"]
        assert np.array_equal(n["clean"], c["clean"])
        # the lead-in, before the first word, holds the noise: about 15 dB under the speech (the
        # 8 kHz band and G.711 take up to a few dB of it)
        lead = n["pcm"][: int(0.4 * n["rate"])].astype(np.float64)
        lead_db = 20 * np.log10(np.sqrt(np.mean(lead * lead))) - 90.31
        assert abs(lead_db - (n["truth"]["speech_level_dbfs"] - 15.0)) < 5.0, (n["id"], lead_db)
