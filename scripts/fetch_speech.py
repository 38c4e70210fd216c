"""Fetch real recorded speech for tests and benchmarks into a local cache (idempotent).

- jfk.wav (public domain) from the pywhispercpp sdist;
- LibriVox clips with transcripts and short command clips from the pocketsphinx sdist
  ``test/data``;
- 8 kHz speech from Debian ``linphone-common`` (hello8000.wav) and ``codec2-examples``;
- for the turn-taking evaluation set (bench/eval_calls.py, docs/eval_set.md):
  Allison Smith's recorded telephony prompts from Debian ``asterisk-core-sounds-en-wav``
  (CC BY-SA 3.0; 8 kHz) with their transcripts (``core-sounds-en.txt.gz`` from
  ``asterisk-core-sounds-en``), the ALSA speaker-test voice from Debian ``alsa-utils``
  (GPL-2, "Front Left" ...), a CMU ARCTIC sentence from the pysptk sdist (MIT; ARCTIC's own
  licence is BSD-style) and "The North Wind and the Sun" from the praat-parselmouth sdist
  (GPL-3).

Nothing here is committed; the cache lives in $VOICE_AGENT_SPEECH or ~/.cache/voice-agent/speech.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

CACHE = Path(os.environ.get("VOICE_AGENT_SPEECH", Path.home() / ".cache" / "voice-agent" / "speech"))
SDISTS = {
    "pywhispercpp": ("1.5.1", ["whisper.cpp/samples/jfk.wav"]),
    "pocketsphinx": ("5.1.1", ["test/data/librivox/", "test/data/cards/", "test/data/goforward.raw"]),
    "pysptk": ("1.0.1", ["pysptk/example_audio_data/arctic_a0007.wav"]),
    "praat-parselmouth": ("0.4.7", ["tests/data/the_north_wind_and_the_sun.wav"]),
}
DEBS = {
    "linphone-common": ["usr/share/sounds/linphone/hello8000.wav", "usr/share/sounds/linphone/hello16000.wav"],
    "codec2-examples": [f"usr/share/codec2/raw/{n}.raw" for n in ("hts1a", "hts2", "big_dog")],
    # a member ending in "/" copies that folder's tree
    "asterisk-core-sounds-en-wav": ["usr/share/asterisk/sounds/en_US_f_Allison/"],
    "asterisk-core-sounds-en": ["usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz",
                                "usr/share/doc/asterisk-core-sounds-en/copyright"],
    "alsa-utils": ["usr/share/sounds/alsa/", "usr/share/doc/alsa-utils/copyright"],
}


def _sdist_url(name: str, version: str) -> str:
    index = f"https://pypi.org/pypi/{name}/json"
    with urllib.request.urlopen(index, timeout=60) as r:
        meta = json.load(r)
    for u in meta.get("releases", {}).get(version, []) or meta["urls"]:
        if u["packagetype"] == "sdist":
            return urllib.parse.urljoin(index, u["url"])  # the index may give relative URLs
    raise RuntimeError(f"no sdist for {name}=={version}")


def fetch_sdist(name: str, version: str, members: list[str]) -> None:
    dest = CACHE / name
    if (dest / ".done").exists():
        return
    print(f"fetch_speech: downloading {name}-{version} sdist", flush=True)
    url = _sdist_url(name, version)
    with urllib.request.urlopen(url, timeout=300) as r:
        blob = r.read()
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tf:
        for m in tf.getmembers():
            # the top folder is <name>-<version>/, spelt as the sdist spells it (praat_parselmouth-0.4.7/)
            top, sep, rel = m.name.partition("/")
            if not sep or not top.endswith(f"-{version}"):
                continue
            if not m.isfile() or not any(rel == x or rel.startswith(x) for x in members):
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with tf.extractfile(m) as src, open(target, "wb") as out:  # type: ignore[union-attr]
                shutil.copyfileobj(src, out)
    (dest / ".done").touch()


def fetch_deb(pkg: str, members: list[str]) -> None:
    dest = CACHE / pkg
    if (dest / ".done").exists():
        return
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        print(f"fetch_speech: skipping {pkg} (no apt-get)", file=sys.stderr)
        return
    print(f"fetch_speech: downloading Debian {pkg}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["apt-get", "download", pkg], cwd=tmp, check=True, capture_output=True)
        deb = next(Path(tmp).glob("*.deb"))
        subprocess.run(["dpkg-deb", "-x", str(deb), str(Path(tmp) / "x")], check=True)
        for m in members:
            src = Path(tmp) / "x" / m
            if m.endswith("/"):
                shutil.copytree(src, dest / Path(m).name, dirs_exist_ok=True)
                continue
            target = dest / Path(m).name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)
    (dest / ".done").touch()


def main() -> int:
    CACHE.mkdir(parents=True, exist_ok=True)
    for name, (version, members) in SDISTS.items():
        fetch_sdist(name, version, members)
    for pkg, members in DEBS.items():
        try:
            fetch_deb(pkg, members)
        except (subprocess.CalledProcessError, StopIteration) as exc:
            print(f"fetch_speech: could not fetch {pkg}: {exc}", file=sys.stderr)
    print(f"fetch_speech: speech cached in {CACHE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
