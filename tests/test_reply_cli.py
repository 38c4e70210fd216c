"""`voice-agent reply`: the LM alone, through the real command and the embedded model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "pipelines.cli", "reply"]


def _run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def test_prompt_file_gives_one_reply_per_line_in_the_json_contract(tmp_path: Path) -> None:
    prompts = ["I'm calling about my order.", "Can I speak to a real person?", "Thanks, bye."]
    src = tmp_path / "prompts.txt"
    src.write_text("\n".join(prompts[:2]) + "\n\n" + prompts[2] + "\n")  # blank lines are skipped
    out = tmp_path / "out" / "replies.json"
    r = _run("--prompts", str(src), "--json", str(out))
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["replies"]
    assert [row["prompt"] for row in rows] == prompts
    for row in rows:
        assert set(row) == {"prompt", "reply", "ms", "steps"}
        assert isinstance(row["reply"], str) and row["reply"].strip()
        assert isinstance(row["ms"], float) and row["ms"] > 0
        assert isinstance(row["steps"], int) and row["steps"] >= 1


def test_text_prints_one_reply() -> None:
    r = _run("--text", "Hello, can you hear me?")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1 and len(lines[0].split()) >= 1


def test_a_deadline_ends_a_reply_at_a_sentence_end_as_in_a_call() -> None:
    """The reply to this line is one long sentence: 1 ms is far too short for it, and the reply
    streamed (the default) is still the whole sentence, not cut where the time ran out."""
    line = "Ask not what your country can do for you. Ask what you can do for your country."
    whole = _run("--text", line)
    late = _run("--text", line, "--deadline-ms", "1")
    assert whole.returncode == late.returncode == 0, late.stderr
    assert late.stdout.strip() == whole.stdout.strip() and whole.stdout.strip().endswith((".", "!", "?"))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: ["--prompts", str(d / "missing.txt"), "--json", str(d / "o.json")], "not found"),
        (lambda d: ["--prompts", str(_write(d / "empty.txt", "\n  \n")), "--json", str(d / "o.json")], "no lines"),
        (lambda d: ["--prompts", str(_write(d / "p.txt", "hi\n"))], "--json"),
        (lambda d: ["--text", "hi", "--config", str(_write(d / "c.yaml", "llm:\n  tau: 7\n"))], "llm.tau"),
        (lambda d: ["--text", "hi", "--config", str(_write(d / "c.yaml", f"llm:\n  model_path: {d / 'nowhere'}\n"))],
         "no model directory"),
    ],
    ids=["missing-file", "empty-file", "no-json", "bad-config", "missing-model"],
)
def test_bad_input_is_a_clear_error(tmp_path: Path, make, message: str) -> None:  # noqa: ANN001
    r = _run(*make(tmp_path))
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o.json").exists()


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_windows_saved_prompt_file_reads_as_its_lines(tmp_path: Path) -> None:
    from pipelines.reply_cli import read_prompts

    src = tmp_path / "prompts.txt"
    src.write_bytes("\ufeffHello, is this the help line?\r\n\r\n  Thanks, bye.\t\r\n".encode())
    assert read_prompts(src) == ["Hello, is this the help line?", "Thanks, bye."]
