"""A content hash of a model directory: what identifies the weights a reply came from.

Every file of the directory (weights, config, tokenizer, train meta) is hashed by name and
content, so retraining, swapping or editing a checkpoint gives a new fingerprint. A file over
``max_hash_bytes`` (a multi-gigabyte checkpoint) is identified by its size and mtime instead,
beside the directory's ``train_meta.json`` content. Results are memoised per directory state.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

MAX_HASH_BYTES = 1 << 30


def model_fingerprint(path: str | Path, max_hash_bytes: int = MAX_HASH_BYTES) -> str:
    """Blocking (reads the files; about 30 ms for the embedded 13 MB model)."""
    p = Path(path).resolve()
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    state = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    return _fingerprint(state, max_hash_bytes)


@lru_cache(maxsize=32)
def _fingerprint(state: tuple[tuple[str, int, int], ...], max_hash_bytes: int) -> str:
    h = hashlib.sha256()
    for name, size, mtime in state:
        h.update(Path(name).name.encode() + b"\0")
        if size <= max_hash_bytes:
            with open(name, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        else:
            h.update(f"{size}:{mtime}".encode())
    return h.hexdigest()[:32]
