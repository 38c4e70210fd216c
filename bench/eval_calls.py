"""A turn-taking evaluation set of real recorded human speech (issue 21; docs/eval_set.md).

Calls are built, deterministically, from the clips scripts/fetch_speech.py caches: each call
is one caller channel with 3-4 turns after a 0.6 s lead-in, each turn followed by 3.5-4.5 s
(more after long turns) left for the agent's reply. Turn kinds:

- ``pause``: one sentence with 1-2 pauses of 400-800 ms inserted at word boundaries (after a
  function word or a content word), cut at the lowest-energy 10 ms point near the boundary;
- ``join``: two complete sentences of one speaker with 200-400 ms of silence between them;
- ``short``: a bare short answer ("yes", "ten of clubs", a number);
- ``sentence``: a whole sentence as recorded.

Ground truth is measured on the clean turn audio (before noise and codec) with the energy
gate of tests/ground_truth.py. Half the calls go through the telephone band (8 kHz, G.711
mu-law); all get a white noise floor, a quarter also pink noise at 25 dB SNR. A stress
variant (``--snr DB``, ``load_calls(split, snr=DB)``) puts pink noise at DB SNR on every call
and leaves everything else, the truth included, as it was.

    python bench/eval_calls.py --out DIR [--split dev|test|all] [--snr DB]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import soundfile as sf
from scipy.signal import resample_poly

if TYPE_CHECKING:
    from faster_whisper import WhisperModel

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.ground_truth import FRAME_S, _frame_db, _noise_floor  # noqa: E402

VERSION = "v2"
RATE = 16000
SPEECH = Path(os.environ.get("VOICE_AGENT_SPEECH", Path.home() / ".cache" / "voice-agent" / "speech"))
CACHE = Path.home() / ".cache" / "voice-agent" / "eval_calls"
SPLITS = ("dev", "test")
LEAD_IN_S = 0.6
NATURAL_PAUSE_S = 0.25  # a silence this long inside a recorded turn is a pause, not a stop consonant
FLOOR_DB = 35.0  # the gate: within 35 dB of the loudest frame (tests/ground_truth.py's rule, 35 not 40 dB)
PEAK_DBFS = (-16.0, -12.0)  # each turn's loudest 10 ms frame is scaled into this range
CUT_QUIET_DB = 20.0  # a cut point's 10 ms either side lies this far below the loudest frame
FUNCTION = frozenset(
    "the a an to of is are was were be been please which and or but for in on at by with from that this "
    "your you my his her their its it if as so then than there when what who how not no do does did "
    "has have had will would can could may might must shall should into after before followed".split()
)
LICENSES = {
    "allison": "Asterisk core sounds (Debian asterisk-core-sounds-en-wav 1.6.1), recorded by Allison Smith; "
               "CC BY-SA 3.0",
    "librivox": "LibriVox 'Sense and Sensibility' via pocketsphinx 5.1.1 sdist test/data; public domain "
                "(pocketsphinx: BSD-2-Clause)",
    "jfk": "JFK inaugural address via pywhispercpp 1.5.1 sdist (whisper.cpp samples); public domain",
    "cards": "pocketsphinx 5.1.1 sdist test/data/cards; BSD-2-Clause",
    "goforward": "pocketsphinx 5.1.1 sdist test/data/goforward.raw; BSD-2-Clause",
    "alsa": "ALSA speaker-test voice (Debian alsa-utils 1.2.8, /usr/share/sounds/alsa); GPL-2",
    "arctic": "CMU ARCTIC arctic_a0007 via pysptk 1.0.1 sdist; pysptk MIT, CMU ARCTIC BSD-style free licence",
    "northwind": "'The North Wind and the Sun' via praat-parselmouth 0.4.7 sdist tests/data; GPL-3",
    "codec2": "Debian codec2-examples (hts1a, hts2, big_dog raw 8 kHz); LGPL-2.1",
    "linphone": "Debian linphone-common hello8000.wav; GPL-3",
}


# ---------------------------------------------------------------------------- sources


@dataclass
class Unit:
    """One source utterance: a whole recorded clip."""

    id: str
    speaker: str
    source: str  # a key of LICENSES
    path: Path
    text: str | None
    raw_rate: int | None = None  # headerless int16 files
    words: list[tuple[str, float, float]] | None = None  # (word, begin_s, end_s) in the clip
    floor_db: float = -np.inf  # the noise floor of this source's recordings (int16-scale dB)
    _audio: np.ndarray | None = field(default=None, repr=False)

    def audio(self) -> np.ndarray:
        """The clip at 16 kHz, float64 on the int16 scale."""
        if self._audio is None:
            if self.raw_rate:
                x, sr = np.fromfile(self.path, dtype="<i2").astype(np.float64), self.raw_rate
            else:
                x, sr = sf.read(self.path, dtype="int16", always_2d=True)
                x = x[:, 0].astype(np.float64)
            if sr != RATE:
                g = np.gcd(sr, RATE)
                x = resample_poly(x, RATE // g, sr // g)
            self._audio = x
        return self._audio

    @property
    def n_words(self) -> int:
        return len(self.text.split()) if self.text else 0


def _norm(text: str) -> str:
    text = text.lower().replace("-", " ")
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text).split())


def _pocketsphinx_listing(folder: str, listing: str) -> list[tuple[str, str]]:
    root = SPEECH / "pocketsphinx/test/data" / folder
    out = []
    for line in (root / listing).read_text().splitlines():
        text, _, rest = line.partition("(")
        out.append((rest.strip(") "), " ".join(w for w in text.split() if w not in ("<s>", "</s>"))))
    return out


def sources() -> list[Unit]:
    """Every usable source utterance in the speech cache (fetch_speech.py), sorted by id."""
    units: list[Unit] = []
    lv = SPEECH / "pocketsphinx/test/data/librivox"
    for clip_id, text in _pocketsphinx_listing("librivox", "transcription"):
        ali = json.loads((lv / f"{clip_id}.json").read_text())
        words = [(re.sub(r"\(\d+\)$", "", w["t"]), w["b"], w["b"] + w["d"]) for w in ali["w"]
                 if not w["t"].startswith("<")]
        units.append(Unit(f"librivox/{clip_id[-4:]}", "librivox-reader", "librivox", lv / f"{clip_id}.wav", text,
                          words=words))
    for clip_id, text in _pocketsphinx_listing("cards", "cards.transcription"):
        units.append(Unit(f"cards/{clip_id}", "pocketsphinx-cards", "cards",
                          SPEECH / f"pocketsphinx/test/data/cards/{clip_id}.wav", text))
    units.append(Unit("pocketsphinx/goforward", "pocketsphinx-goforward", "goforward",
                      SPEECH / "pocketsphinx/test/data/goforward.raw", "go forward ten meters", raw_rate=16000))
    units.append(Unit("jfk", "jfk", "jfk", SPEECH / "pywhispercpp/whisper.cpp/samples/jfk.wav",
                      "and so my fellow americans ask not what your country can do for you "
                      "ask what you can do for your country"))
    units.append(Unit("arctic/a0007", "cmu-arctic", "arctic",
                      SPEECH / "pysptk/pysptk/example_audio_data/arctic_a0007.wav",
                      "and you always want to see it in the superlative degree"))
    units.append(Unit("northwind", "praat-northwind", "northwind",
                      SPEECH / "praat-parselmouth/tests/data/the_north_wind_and_the_sun.wav",
                      "the north wind and the sun"))
    for f in sorted((SPEECH / "alsa-utils/alsa").glob("*.wav")):
        if f.stem != "Noise":
            units.append(Unit(f"alsa/{f.stem}", "alsa-voice", "alsa", f, _norm(f.stem.replace("_", " "))))
    for n in ("hts1a", "hts2", "big_dog"):
        units.append(Unit(f"codec2/{n}", f"codec2-{n}", "codec2", SPEECH / f"codec2-examples/{n}.raw", None,
                          raw_rate=8000))
    units.append(Unit("linphone/hello8000", "linphone-hello", "linphone", SPEECH / "linphone-common/hello8000.wav",
                      None))
    allison = SPEECH / "asterisk-core-sounds-en-wav/en_US_f_Allison"
    with gzip.open(SPEECH / "asterisk-core-sounds-en/core-sounds-en.txt.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            name, sep, text = line.partition(":")
            name, text = name.strip(), text.strip()
            if not sep or name.startswith(";") or not text or any(c in text for c in "[]()/&@#$%*<>"):
                continue
            # one spoken thing per prompt: no digits written as numerals, no ellipses
            if re.search(r"\d", text) or "..." in text or not (allison / f"{name}.wav").exists():
                continue
            units.append(Unit(f"allison/{name}", "allison-smith", "allison", allison / f"{name}.wav", _norm(text)))
    missing = [u.path for u in units if not u.path.exists()]
    if missing:
        raise FileNotFoundError(f"missing speech {missing[:3]}: run scripts/fetch_speech.py")
    # one noise floor per source (tests/ground_truth._noise_floor over all its clips): a clip
    # that is nearly all speech has no floor of its own
    for src in {u.source for u in units}:
        mine = [u for u in units if u.source == src]
        floor = _noise_floor(np.concatenate([_frame_db(u.audio(), RATE) for u in mine]))
        for u in mine:
            u.floor_db = floor
    return sorted(units, key=lambda u: u.id)


def _hash(s: str) -> int:
    return int(hashlib.sha1(s.encode()).hexdigest()[:12], 16)


def split_of(units: list[Unit]) -> dict[str, str]:
    """unit id -> "dev"|"test": per speaker, units in stable-hash order alternate test, dev, ...
    so every speaker with two or more utterances is in both splits."""
    out: dict[str, str] = {}
    by_spk: dict[str, list[Unit]] = {}
    for u in units:
        by_spk.setdefault(u.speaker, []).append(u)
    for spk, us in by_spk.items():
        us = sorted(us, key=lambda u: _hash(u.id))
        first = _hash(spk) % 2  # speakers with one utterance are spread over both splits
        for i, u in enumerate(us):
            out[u.id] = SPLITS[(i + first) % 2]
    return out


# ---------------------------------------------------------------------------- words


_MODEL: list[WhisperModel] = []


def _whisper() -> WhisperModel:
    if not _MODEL:
        from faster_whisper import WhisperModel

        from voice.asr import default_model_path

        _MODEL.append(WhisperModel(str(default_model_path()), device="cpu", compute_type="int8", cpu_threads=2))
    return _MODEL[0]


def _whisper_words(units: list[Unit]) -> None:
    """Word timestamps by faster-whisper tiny.en (loaded as voice/asr.py loads it), cached;
    a unit whose recognised words differ from its reference keeps ``words = None``."""
    path = CACHE / "words-tiny.en.json"
    cache = json.loads(path.read_text()) if path.exists() else {}
    todo = [u for u in units if u.words is None and u.text and u.id not in cache]
    if todo:
        model = _whisper()
        for u in todo:
            segs, _ = model.transcribe((u.audio() / 32768).astype(np.float32), language="en", beam_size=1,
                                       word_timestamps=True, condition_on_previous_text=False)
            ws = [(_norm(w.word), float(w.start), float(w.end)) for s in segs for w in (s.words or [])]
            ws = [w for w in ws if w[0]]
            cache[u.id] = ws if " ".join(w[0] for w in ws) == u.text else None
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cache))
    for u in units:
        if u.words is None and cache.get(u.id):
            u.words = [tuple(w) for w in cache[u.id]]  # type: ignore[misc]


# ---------------------------------------------------------------------------- turns


def _gate(x: np.ndarray, floor_db: float | None = None) -> tuple[np.ndarray, float]:
    """tests/ground_truth.speech_end's gate (35 dB here), with the noise floor of the source
    when given, else of ``x``."""
    db = _frame_db(x, RATE)
    floor = _noise_floor(db) if floor_db is None else floor_db
    return db, max(db.max() - FLOOR_DB, floor + 10.0)


def audible_span(x: np.ndarray, floor_db: float | None = None) -> tuple[float, float]:
    """(first audible sample, last audible sample) in seconds: the start of the first and the
    end of the last 10 ms frame over the gate."""
    db, gate = _gate(x, floor_db)
    loud = np.nonzero(db >= gate)[0]
    return float(loud[0] * FRAME_S), float((loud[-1] + 1) * FRAME_S)


def _window_db(x: np.ndarray, a: float, b: float) -> float:
    seg = x[max(0, int(a * RATE)): max(0, int(b * RATE))]
    return float(20 * np.log10(np.sqrt(np.mean(seg * seg)) + 1e-9)) if len(seg) else -180.0


def _cut_points(u: Unit) -> list[tuple[int, float, str]]:
    """(word index, cut time s, "function"|"content") for each inner word boundary of ``u``
    with a quiet point: the lowest-energy 10 ms frame (5 ms hop) near the boundary, where the
    10 ms either side lie CUT_QUIET_DB below the clip's loudest frame."""
    x, words = u.audio(), u.words or []
    peak = _frame_db(x, RATE).max()
    out = []
    for i in range(len(words) - 1):
        a, b = words[i][2], words[i + 1][1]
        lo, hi = min(a, b) - 0.06, max(a, b) + 0.06
        ts = np.arange(max(lo, 0.005), hi, 0.005)
        if len(ts) == 0:
            continue
        e = [_window_db(x, t - 0.005, t + 0.005) for t in ts]
        t = float(ts[int(np.argmin(e))])
        if max(_window_db(x, t - 0.01, t), _window_db(x, t, t + 0.01)) <= peak - CUT_QUIET_DB:
            out.append((i, t, "function" if words[i][0] in FUNCTION else "content"))
    return out


@dataclass
class Turn:
    kind: str
    units: list[Unit]
    audio: np.ndarray  # clean, 16 kHz
    text: str | None
    pauses: list[dict]  # times relative to the turn audio's start
    start_s: float = 0.0
    end_s: float = 0.0
    gate_db: float = 0.0

    def __post_init__(self) -> None:
        # whole 10 ms frames, ending in silence: a clip cut off inside a sound ends there
        n = -len(self.audio) % int(RATE * FRAME_S) + int(RATE * 0.1)
        self.audio = np.concatenate([self.audio, np.zeros(n)])
        frac = _hash("+".join(u.id for u in self.units)) % 1000 / 1000
        target = PEAK_DBFS[0] + frac * (PEAK_DBFS[1] - PEAK_DBFS[0]) + 90.31
        gain_db = target - _frame_db(self.audio, RATE).max()
        self.audio = self.audio * 10 ** (gain_db / 20)
        floor = self.units[0].floor_db + gain_db
        self.start_s, self.end_s = audible_span(self.audio, floor)
        self.gate_db = _gate(self.audio, floor)[1]
        self.pauses = sorted(self.pauses + self._natural_pauses(), key=lambda p: p["start_s"])

    def _natural_pauses(self) -> list[dict]:
        """The speaker's own silences of ``NATURAL_PAUSE_S`` or more inside the turn (JFK's
        "my fellow Americans ... ask not"): an agent that speaks there cuts the caller off too."""
        db = _frame_db(self.audio, RATE)
        quiet = db < self.gate_db
        out, run = [], None
        for i in range(int(self.start_s / FRAME_S), int(self.end_s / FRAME_S) + 1):
            if i < len(quiet) and quiet[i]:
                run = i if run is None else run
                continue
            if run is not None and (i - run) * FRAME_S >= NATURAL_PAUSE_S:
                a, b = run * FRAME_S, i * FRAME_S
                if not any(p["start_s"] < b and a < p["end_s"] for p in self.pauses):
                    out.append({"start_s": round(a, 3), "end_s": round(b, 3), "after_word": None, "kind": "natural"})
            run = None
        return out


def _trimmed(u: Unit, head: float, tail: float) -> tuple[np.ndarray, float]:
    """The clip from ``head`` s before its first audible sample to ``tail`` s after its last;
    and the offset (s) of the cut start in the clip."""
    x = u.audio()
    a, b = audible_span(x, u.floor_db)
    s0 = max(0, int((a - head) * RATE))
    return x[s0: min(len(x), int((b + tail) * RATE))], s0 / RATE


def _pause_turn(u: Unit, rng: np.random.Generator, prefer: str) -> Turn | None:
    cuts = _cut_points(u)
    if not cuts:
        return None
    x, off = _trimmed(u, 0.15, 0.25)
    cuts = [(i, t - off, k) for i, t, k in cuts if 0 < t - off < len(x) / RATE]
    first = [c for c in cuts if c[2] == prefer] or cuts
    chosen = [first[int(rng.integers(len(first)))]]
    rest = [c for c in cuts if abs(c[0] - chosen[0][0]) >= 3]
    if rest and len(u.words or []) >= 8 and rng.random() < 0.4:
        chosen.append(rest[int(rng.integers(len(rest)))])
    chosen.sort()
    parts, pauses, last, shift = [], [], 0, 0.0
    for i, t, k in chosen:
        d = round(float(rng.uniform(0.4, 0.8)), 3)
        n = int(round(t * RATE))
        parts += [x[last:n], np.zeros(int(round(d * RATE)))]
        pauses.append({"start_s": n / RATE + shift, "end_s": n / RATE + shift + d,
                       "after_word": (u.words or [])[i][0], "kind": k})
        shift += int(round(d * RATE)) / RATE
        last = n
    parts.append(x[last:])
    return Turn("pause", [u], np.concatenate(parts), u.text, pauses)


def _deep_span(x: np.ndarray, below_db: float = 50.0) -> tuple[int, int]:
    """Samples [first, last) of the frames within ``below_db`` of the loudest: a faint tail
    beyond them is cut, no sound."""
    db = _frame_db(x, RATE)
    loud = np.nonzero(db >= db.max() - below_db)[0]
    n = int(RATE * FRAME_S)
    return int(loud[0] * n), int((loud[-1] + 1) * n)


def _join_turn(a: Unit, b: Unit, rng: np.random.Generator) -> Turn:
    """Sentence a, 200-400 ms of digital silence, sentence b; the silence joins a's last and
    b's first frame within 50 dB of their loudest (the 35 dB gate's gap is a little longer)."""
    xa, xb = a.audio(), b.audio()
    a0 = max(0, int((audible_span(xa, a.floor_db)[0] - 0.15) * RATE))
    a1 = _deep_span(xa)[1]
    b0 = _deep_span(xb)[0]
    b1 = min(len(xb), int((audible_span(xb, b.floor_db)[1] + 0.25) * RATE))
    gap = int(round(float(rng.uniform(0.2, 0.4)) * RATE))
    audio = np.concatenate([xa[a0:a1], np.zeros(gap), xb[b0:b1]])
    s = (a1 - a0) / RATE
    last = a.text.split()[-1] if a.text else None
    text = f"{a.text} {b.text}" if a.text and b.text else None
    return Turn("join", [a, b], audio, text, [{"start_s": s, "end_s": s + gap / RATE, "after_word": last,
                                                "kind": "join"}])


def _whole_turn(u: Unit, kind: str) -> Turn:
    return Turn(kind, [u], _trimmed(u, 0.15, 0.25)[0], u.text, [])


KIND_TARGET = {"pause": 21, "join": 18, "short": 19, "sentence": 19}


def _turns(units: list[Unit], split: str) -> list[Turn]:
    """The turns of one split, from that split's source utterances only."""
    rng = np.random.default_rng(_hash(f"{VERSION}/{split}") % 2**32)
    where = split_of(units)
    mine = [u for u in units if where[u.id] == split]
    order = sorted(mine, key=lambda u: _hash(f"{split}/{u.id}"))
    others = [u for u in order if u.source != "allison"]  # the rarer speakers go first
    allison = [u for u in order if u.source == "allison"]
    turns: list[Turn] = []

    short = [u for u in others if u.text and u.n_words <= 4] + [u for u in allison if u.n_words <= 2]
    for u in short[: KIND_TARGET["short"]]:
        turns.append(_whole_turn(u, "short"))

    sent = [u for u in others if not u.text or u.n_words > 4] + [u for u in allison if 5 <= u.n_words <= 16]
    for u in sent[: KIND_TARGET["sentence"]]:
        turns.append(_whole_turn(u, "sentence"))

    cand = [u for u in others if u.n_words >= 4] + [u for u in allison if 5 <= u.n_words <= 14]
    made = 0
    for u in cand:
        if made >= KIND_TARGET["pause"]:
            break
        if u.words is None:
            _whisper_words([u])
        t = _pause_turn(u, rng, "content" if made % 3 == 2 else "function")
        if t is not None:
            turns.append(t)
            made += 1

    # joins: two complete one-sentence utterances of one speaker
    pool: dict[str, list[Unit]] = {}
    for u in others + allison[::-1]:
        if u.text and 2 <= u.n_words <= 14:
            pool.setdefault(u.speaker, []).append(u)
    made = 0
    for spk in sorted(pool, key=lambda s: (s == "allison-smith", s)):
        us = pool[spk]
        k = 0
        while k + 1 < len(us) and made < KIND_TARGET["join"] and (spk == "allison-smith" or k < 2):
            turns.append(_join_turn(us[k], us[k + 1], rng))
            made += 1
            k += 2
    return turns


# ---------------------------------------------------------------------------- calls


def _pink(n: int, rng: np.random.Generator) -> np.ndarray:
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.fft.rfftfreq(n)
    f[0] = f[1]
    x = np.fft.irfft(spec / np.sqrt(f), n)
    return x / np.sqrt(np.mean(x * x))


def mulaw_roundtrip(x: np.ndarray) -> np.ndarray:
    """G.711 mu-law encode then decode, int16-scale in and out (the segment tables of G.711)."""
    s = np.clip(np.round(x), -32768, 32767).astype(np.int32)
    sign = s < 0
    mag = np.minimum(np.abs(s), 32635) + 0x84
    exp = np.floor(np.log2(mag)).astype(np.int32) - 7
    mant = (mag >> (exp + 3)) & 0x0F
    dec = (((mant << 3) + 0x84) << exp) - 0x84
    return np.where(sign, -dec, dec).astype(np.float64)


def _calls(split: str, units: list[Unit], snr: float | None = None) -> list[dict]:
    turns = _turns(units, split)
    rng = np.random.default_rng(_hash(f"{VERSION}/{split}/calls") % 2**32)
    turns = [turns[i] for i in rng.permutation(len(turns))]
    sizes: list[int] = []
    left = len(turns)
    while left > 0:
        k = 3 if left in (3, 6) or (left != 4 and left != 8 and rng.random() < 0.5) else 4
        k = min(k, left)
        sizes.append(k)
        left -= k
    calls, i = [], 0
    for c, k in enumerate(sizes):
        calls.append(_assemble(f"{split}-{c:03d}", split, c, turns[i: i + k], rng, snr))
        i += k
    return calls


def _assemble(call_id: str, split: str, index: int, turns: list[Turn], rng: np.random.Generator,
              all_snr: float | None = None) -> dict:
    pieces, truth_turns, t = [], [], LEAD_IN_S
    for tr in turns:
        at = int(round(t / FRAME_S)) * int(RATE * FRAME_S)  # on the 10 ms grid: truth times are exact
        pieces.append((at, tr.audio))
        start, end = at / RATE + tr.start_s, at / RATE + tr.end_s
        speech = tr.end_s - tr.start_s
        gap = float(rng.uniform(3.5, 4.5)) + 0.15 * max(0.0, speech - 3.0)
        truth_turns.append({
            "start_s": round(start, 3), "end_s": round(end, 3), "kind": tr.kind, "text": tr.text,
            "speaker": tr.units[0].speaker, "sources": [u.id for u in tr.units], "gap_after_s": round(gap, 3),
            "gate_dbfs": round(tr.gate_db - 90.31, 2),
            "pauses": [{**p, "start_s": round(at / RATE + p["start_s"], 3), "end_s": round(at / RATE + p["end_s"], 3)}
                       for p in tr.pauses],
        })
        t = max(end + gap, (at + len(tr.audio)) / RATE + 0.05)
    clean = np.zeros(int(round(t * RATE)))
    for at, a in pieces:
        clean[at: at + len(a)] += a
    db, gate = _gate(clean)
    active = float(np.mean(10 ** (db[db >= gate] / 10)))  # mean power of the audible frames
    nrng = np.random.default_rng(_hash(call_id) % 2**32)
    floor_dbfs = round(float(nrng.uniform(-60.0, -55.0)), 1)
    noisy = clean + nrng.standard_normal(len(clean)) * 32768 * 10 ** (floor_dbfs / 20)
    snr = all_snr if all_snr is not None else 25.0 if index % 8 in (0, 5) else None
    if snr is not None:
        noisy += _pink(len(clean), nrng) * np.sqrt(active) * 10 ** (-snr / 20)
    codec = "pcmu" if index % 2 == 1 else "none"
    rate = RATE
    if codec == "pcmu":
        noisy = mulaw_roundtrip(resample_poly(noisy, 1, 2))
        rate = 8000
    pcm = np.clip(np.round(noisy), -32768, 32767).astype(np.int16)
    truth = {
        "id": call_id, "split": split, "version": VERSION, "rate": rate, "codec": codec,
        "noise_floor_dbfs": floor_dbfs, "noise_snr_db": snr,
        "speech_level_dbfs": round(10 * np.log10(active) - 90.31, 1),
        "duration_s": round(len(pcm) / rate, 3), "speakers": sorted({x["speaker"] for x in truth_turns}),
        "turns": truth_turns,
    }
    return {"id": call_id, "pcm": pcm, "clean": clean, "rate": rate, "truth": truth}


def build(out: Path, splits: tuple[str, ...] = SPLITS, snr: float | None = None) -> dict:
    """Write DIR/<split>/<call_id>.wav|.json and DIR/manifest.json; returns the manifest.
    ``snr``: pink noise at that SNR on every call (the stress variant)."""
    units = sources()
    manifest: dict = {"version": VERSION, "licenses": LICENSES, "splits": {}}
    for split in splits:
        d = out / split
        d.mkdir(parents=True, exist_ok=True)
        calls = _calls(split, units, snr)
        by_spk: dict[str, int] = {}
        by_kind: dict[str, int] = {}
        pauses: dict[str, int] = {}
        for c in calls:
            sf.write(d / f"{c['id']}.wav", c["pcm"], c["rate"], subtype="PCM_16")
            (d / f"{c['id']}.json").write_text(json.dumps(c["truth"], indent=1))
            for tr in c["truth"]["turns"]:
                by_spk[tr["speaker"]] = by_spk.get(tr["speaker"], 0) + 1
                by_kind[tr["kind"]] = by_kind.get(tr["kind"], 0) + 1
                for p in tr["pauses"]:
                    pauses[p["kind"]] = pauses.get(p["kind"], 0) + 1
        manifest["splits"][split] = {
            "calls": [c["id"] for c in calls], "n_calls": len(calls),
            "n_turns": sum(len(c["truth"]["turns"]) for c in calls),
            "turns_by_speaker": dict(sorted(by_spk.items())), "turns_by_kind": dict(sorted(by_kind.items())),
            "pauses_by_kind": dict(sorted(pauses.items())),
            "calls_by_codec": {k: sum(c["truth"]["codec"] == k for c in calls) for k in ("none", "pcmu")},
            "calls_with_pink_noise": sum(c["truth"]["noise_snr_db"] is not None for c in calls),
            "source_utterances": sorted({s for c in calls for tr in c["truth"]["turns"] for s in tr["sources"]}),
        }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def clean_calls(split: str) -> list[dict]:
    """The calls of ``split`` built in memory, with their clean 16 kHz tracks (``clean``) as well."""
    units = sources()
    return _calls(split, units)


def load_calls(split: str = "test", cache: Path | None = None, snr: float | None = None) -> list[dict]:
    """The calls of ``split`` ("dev", "test" or "all"), built once into ``cache`` (default
    ~/.cache/voice-agent/eval_calls/<VERSION>, or <VERSION>-snr<DB> for the stress variant with
    pink noise at ``snr`` dB on every call): [{"id", "wav": Path, "rate", "truth": {...}}]."""
    root = cache or CACHE / (VERSION if snr is None else f"{VERSION}-snr{snr:g}")
    if not (root / "manifest.json").exists():
        build(root, snr=snr)
    manifest = json.loads((root / "manifest.json").read_text())
    out = []
    for s in (SPLITS if split == "all" else (split,)):
        for cid in manifest["splits"][s]["calls"]:
            truth = json.loads((root / s / f"{cid}.json").read_text())
            out.append({"id": cid, "wav": root / s / f"{cid}.wav", "rate": truth["rate"], "truth": truth})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--split", choices=("dev", "test", "all"), default="all")
    ap.add_argument("--snr", type=float, help="pink noise at this SNR (dB) on every call (a stress variant)")
    args = ap.parse_args(argv)
    m = build(args.out, SPLITS if args.split == "all" else (args.split,), args.snr)
    for s, v in m["splits"].items():
        print(f"{s}: {v['n_calls']} calls, {v['n_turns']} turns, kinds {v['turns_by_kind']}, "
              f"pauses {v['pauses_by_kind']}, speakers {v['turns_by_speaker']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
