"""Fetch real recorded speech for tests and benchmarks into a local cache (idempotent).

- jfk.wav (public domain) from the pywhispercpp sdist;
- LibriVox clips with transcripts and short command clips from the pocketsphinx sdist
  ``test/data``;
- 8 kHz speech from Debian ``linphone-common`` (hello8000.wav) and ``codec2-examples``.

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
import urllib.request
from pathlib import Path

CACHE = Path(os.environ.get("VOICE_AGENT_SPEECH", Path.home() / ".cache" / "voice-agent" / "speech"))
SDISTS = {
    "pywhispercpp": ("1.5.1", ["whisper.cpp/samples/jfk.wav"]),
    "pocketsphinx": ("5.1.1", ["test/data/librivox/", "test/data/cards/", "test/data/goforward.raw"]),
}
DEBS = {
    "linphone-common": ["usr/share/sounds/linphone/hello8000.wav", "usr/share/sounds/linphone/hello16000.wav"],
    "codec2-examples": [f"usr/share/codec2/raw/{n}.raw" for n in ("hts1a", "hts2", "big_dog")],
}


def _sdist_url(name: str, version: str) -> str:
    with urllib.request.urlopen(f"https://pypi.org/pypi/{name}/json", timeout=60) as r:
        meta = json.load(r)
    for u in meta.get("releases", {}).get(version, []) or meta["urls"]:
        if u["packagetype"] == "sdist":
            return u["url"]
    raise RuntimeError(f"no sdist for {name}=={version}")


def fetch_sdist(name: str, version: str, members: list[str]) -> None:
    dest = CACHE / name
    if (dest / ".done").exists():
        return
    print(f"fetch_speech: downloading {name}-{version} sdist", flush=True)
    url = _sdist_url(name, version)
    with urllib.request.urlopen(url, timeout=300) as r:
        blob = r.read()
    prefix = f"{name}-{version}/"
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tf:
        for m in tf.getmembers():
            rel = m.name[len(prefix):] if m.name.startswith(prefix) else None
            if rel is None or not m.isfile() or not any(rel == x or rel.startswith(x) for x in members):
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
