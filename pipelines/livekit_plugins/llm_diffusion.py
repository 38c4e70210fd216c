"""Our diffusion LM responder as a livekit-agents LLM plugin.

A diffusion LM does not write token by token, but the block LM streams its reply as a
remote LM does (`llm.reply_chunks`): the plugin sends the text up to its first sentence
and the start of the next as one chat chunk, as soon as that is decoded, so the TTS speaks
the first sentence while the rest is decoded, and the rest as a second chunk. A model that
does not stream (``llm.stream: false``, a masked LM) gives one chunk. Past the deadline the
reply ends at a sentence end, never inside one; an interruption (the stream closed) stops
the decoding. The last user message is the prompt; earlier user/assistant pairs are the
history (the responder keeps as many as ``llm.history_turns`` says). System instructions
are ignored: the model was trained with its own persona and has no instruction following.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from livekit.agents import llm, utils
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, APIConnectOptions, NotGivenOr

from llm.reply_chunks import reply_chunks
from llm.responder import Responder
from voice.tts import first_sentence_ready


def conversation(chat_ctx: llm.ChatContext) -> tuple[str, list[tuple[str, str]]]:
    """The last user message, and the (user, assistant) pairs before it."""
    turns: list[tuple[str, str]] = []
    user: str | None = None
    for msg in chat_ctx.messages():
        text = (msg.text_content or "").strip()
        if msg.role == "user":
            if user is not None:  # two user messages in a row: one turn
                text = f"{user} {text}".strip()
            user = text
        elif msg.role == "assistant" and user is not None:
            turns.append((user, text))
            user = None
    if user is None:
        return "", turns
    return user, turns


class DiffusionLLM(llm.LLM):
    def __init__(self, responder: Responder, *, deadline_s: float | None = None,
                 first_chunk: Callable[[str], bool] = first_sentence_ready) -> None:
        """``deadline_s``: per-reply compute budget for anytime decoding (None: all steps).
        ``first_chunk``: when the text decoded so far goes out as the first chunk."""
        super().__init__()
        self.responder = responder
        self.deadline_s = deadline_s
        self.first_chunk = first_chunk

    @property
    def model(self) -> str:
        return self.responder.name

    @property
    def provider(self) -> str:
        return "voice-agent"

    def chat(
        self,
        *,
        chat_ctx: llm.ChatContext,
        tools: list[llm.Tool] | None = None,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
        parallel_tool_calls: NotGivenOr[bool] = NOT_GIVEN,
        tool_choice: NotGivenOr[llm.ToolChoice] = NOT_GIVEN,
        extra_kwargs: NotGivenOr[dict[str, Any]] = NOT_GIVEN,
    ) -> DiffusionLLMStream:
        return DiffusionLLMStream(self, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options)


class DiffusionLLMStream(llm.LLMStream):
    _llm: DiffusionLLM

    async def _run(self) -> None:
        user, history = conversation(self._chat_ctx)
        if not user:
            return
        chunk_id = utils.shortuuid("diffusion_")
        # cancelling this task (an interruption) stops the decoder between denoising passes
        async for text in reply_chunks(self._llm.responder, user, history, self._llm.deadline_s,
                                       self._llm.first_chunk):
            self._event_ch.send_nowait(
                llm.ChatChunk(id=chunk_id, delta=llm.ChoiceDelta(role="assistant", content=text))
            )
