"""Our diffusion LM responder as a Pipecat LLM service.

A diffusion LM does not write token by token, but the block LM streams its reply as a
remote LM does (`llm.reply_chunks`): between the usual response start and end frames, one
`LLMTextFrame` holds the text up to its first sentence and the start of the next, pushed
as soon as that is decoded, so the TTS speaks the first sentence while the rest is decoded;
a second holds the rest. A model that does not stream (``llm.stream: false``, a masked LM)
gives one frame. Past the deadline the reply ends at a sentence end, never inside one. The
last user message of the context is the prompt and earlier user/assistant pairs are the
history. System instructions are ignored: the model has its own persona and no instruction
following. An interruption cancels the frame's processing task, which stops the decoder
between passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pipecat.frames.frames import Frame, LLMContextFrame, LLMFullResponseEndFrame, LLMFullResponseStartFrame
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.llm_service import LLMService
from pipecat.services.settings import LLMSettings

from llm.reply_chunks import reply_chunks
from llm.responder import Responder
from voice.tts import first_sentence_ready


def message_text(content: Any) -> str:
    """A message's text: a string, or the text parts of a multi-part content list."""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text").strip()
    return ""


def conversation(messages: list[Any]) -> tuple[str, list[tuple[str, str]]]:
    """The last user message, and the (user, assistant) pairs before it."""
    turns: list[tuple[str, str]] = []
    user: str | None = None
    for msg in messages:
        if not isinstance(msg, dict):
            continue  # an LLM-specific message: not ours
        role, text = msg.get("role"), message_text(msg.get("content"))
        if role == "user":
            user = f"{user} {text}".strip() if user is not None else text  # two in a row: one turn
        elif role == "assistant" and user is not None:
            turns.append((user, text))
            user = None
    return (user or "", turns)


class DiffusionLLMService(LLMService):
    def __init__(self, responder: Responder, *, deadline_s: float | None = None,
                 first_chunk: Callable[[str], bool] = first_sentence_ready, **kwargs: Any) -> None:
        """``deadline_s``: per-reply compute budget for anytime decoding (None: all steps).
        ``first_chunk``: when the text decoded so far goes out as the first frame."""
        kwargs.setdefault("settings", LLMSettings(
            model=responder.name, system_instruction=None, temperature=None, max_tokens=None, top_p=None,
            top_k=None, frequency_penalty=None, presence_penalty=None, seed=None,
            filter_incomplete_user_turns=False, user_turn_completion_config=None,
        ))
        super().__init__(**kwargs)
        self.responder = responder
        self.deadline_s = deadline_s
        self.first_chunk = first_chunk
        # (monotonic at its first text, text so far) of every reply: what the agent meant to say,
        # whether or not it was heard (the assistant aggregator keeps only the sentences that were played)
        self.replies: list[tuple[float, str]] = []

    def can_generate_metrics(self) -> bool:
        return True

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if not isinstance(frame, LLMContextFrame):
            await self.push_frame(frame, direction)
            return
        await self.push_frame(LLMFullResponseStartFrame())
        await self.start_processing_metrics()
        try:
            user, history = conversation(frame.context.get_messages())
            if user:
                said, at = "", None
                async for text in reply_chunks(self.responder, user, history, self.deadline_s, self.first_chunk):
                    said += text
                    if at is None:  # stamped at its first text: its speech may start before the rest is decoded
                        at = len(self.replies)
                        self.replies.append((time.monotonic(), ""))
                    self.replies[at] = (self.replies[at][0], said.strip())
                    await self._push_llm_text(text)
        finally:
            await self.stop_processing_metrics()
            await self.push_frame(LLMFullResponseEndFrame())
