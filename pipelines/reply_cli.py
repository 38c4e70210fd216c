"""`voice-agent reply`: the LM alone, text in and text out.

    voice-agent reply --text "I'm calling about my order."
    voice-agent reply --prompts prompts.txt --json replies.json [--config config.yaml]

Each line is answered as a caller's first turn, with the configured model and decoding
(the defaults unless ``--config`` names a file), and no deadline unless ``--deadline-ms``
sets one, which then works as in a call (a streamed reply, ``llm.stream``, ends at a sentence
end after its first clause). The JSON is ``{"replies": [{"prompt", "reply", "ms", "steps"}]}``: ``ms`` is the
decoding time of that reply, ``steps`` its forward passes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pipelines.config import load_config


class PromptFileError(ValueError):
    pass


def read_prompts(path: Path) -> list[str]:
    """The file's non-blank lines, stripped; a UTF-8 byte-order mark (as Windows editors save
    one) and CRLF line ends are not part of the first prompt."""
    if not path.is_file():
        raise PromptFileError(f"prompt file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptFileError(f"cannot read {path} as UTF-8 text: {exc}") from exc
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise PromptFileError(f"prompt file {path} has no lines to answer")
    return lines


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "reply",
        help="answer text with the LM alone (no audio)",
        description="Answer each caller line with the agent's language model, as a caller's first turn, and "
        "print the reply (--text) or write them all as JSON (--prompts, --json).",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="one caller line; the reply is printed")
    src.add_argument("--prompts", metavar="FILE", type=Path, help="caller lines, one per line")
    p.add_argument("--json", metavar="OUT", type=Path, help="with --prompts: write the replies here")
    p.add_argument("--config", metavar="config.yaml", help="configuration file (default: built-in defaults)")
    p.add_argument("--deadline-ms", type=float, help="anytime budget per reply, as a call's LLM stage gets one")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.prompts is not None and args.json is None:
        print("voice-agent: error: --prompts needs --json OUT", file=sys.stderr)
        return 2
    cfg = load_config(args.config)  # a bad config fails here, naming the key
    try:
        prompts = [args.text.strip()] if args.text is not None else read_prompts(args.prompts)
    except PromptFileError as exc:
        print(f"voice-agent: error: {exc}", file=sys.stderr)
        return 2
    if not prompts[0]:
        print("voice-agent: error: --text is empty", file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    from llm.loader import ModelLoadError
    from llm.responder import Responder

    torch.set_num_threads(cfg.llm.threads)
    try:
        responder = Responder.load(cfg.llm, turn_end=False)  # the reply alone
    except ModelLoadError as exc:
        print(f"voice-agent: error: {exc}", file=sys.stderr)
        return 2
    responder.generate("hello")  # warm-up, so the first reply's time is not the load's
    deadline_s = args.deadline_ms / 1000.0 if args.deadline_ms is not None else None
    from voice.tts import first_part_ready

    def first_clause(ids: list[int]) -> bool:
        """A call hands a streamed reply to speech here (the session's rule), and from then on
        the deadline only ends it at a sentence end."""
        return first_part_ready(responder.text_of(ids), cfg.tts.max_first_words, cfg.tts.split_clauses)

    streamed = first_clause if responder.streams else None
    rows = []
    for text in prompts:
        r = responder.generate(text, deadline_s=deadline_s, on_pass=streamed)
        rows.append({"prompt": text, "reply": r.text, "ms": round(r.stats.total_s * 1000.0, 2), "steps": r.stats.steps})
    if args.text is not None:
        print(rows[0]["reply"])
        return 0
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"replies": rows}, indent=2, ensure_ascii=False))
    return 0
