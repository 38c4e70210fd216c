"""The agent's reply writer: prompt formatting, block decoding, text out.

`Responder.generate` is blocking (torch); `agenerate` runs it in a worker thread and stops
it between denoising passes when the awaiting task is cancelled. The embedded block
diffusion LM decodes with `llm.block_decoder`; masked LMs (the MDLM, LLaDA, Dream) with
`llm.decoder`. `redenoise` is the masked LMs' incremental path: when the caller's partial
transcript changes a little, the previous block is kept and only its low-confidence and
changed positions are re-masked and re-decoded.

The LM's end-of-turn opinion (`turn_end_prob`) is a probe on a masked LM's hidden state
(`llm.turn_end`): the reply model's own when its directory has one, else the embedded
MDLM's (``llm.turn_end_model_path``), or, where that path names one, a causal turn-end LM
(`llm.turn_end_lm`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from llm.block_decoder import BlockDiffusionDecoder, BlockOptions
from llm.config import LlmConfig
from llm.decoder import BlockResult, DecodeOptions, DecodeStats, generate_block, generate_blocks
from llm.loader import EMBEDDED_MDLM, LoadedLM, ModelLoadError, load_lm
from llm.sentence_case import sentence_case
from llm.turn_end import PROBE_FILE, TurnEndProbe
from llm.turn_end_lm import CALIBRATION_FILE, TurnEndLM

log = logging.getLogger(__name__)


@dataclass
class Reply:
    text: str
    ids: list[int]
    block: list[int]
    confidence: list[float]
    stats: DecodeStats
    prompt: str
    remasked: int = -1  # positions re-decoded by a warm start (-1: cold start)
    n_tokens: int | None = None  # reply tokens when ``ids`` does not hold them (a remote LM)
    # A streamed reply returned as soon as its first clause arrived: ``text`` is what had
    # streamed by then and ``tail`` gives the whole text once the stream ends. ``error`` is
    # set if the stream broke after that point (the text so far is kept).
    tail: asyncio.Task[str] | None = None
    error: Exception | None = None

    async def complete(self) -> str:
        """The whole reply text. Cancelling the awaiting task does not stop the stream (others
        may share this reply): `cancel` does."""
        if self.tail is None:
            return self.text
        try:
            return await asyncio.shield(self.tail)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self.tail.cancelled() and task is not None and not task.cancelling():
                return self.text  # its owner stopped the stream, not our caller: what had come
            raise

    def cancel(self) -> None:
        """Stop a reply that is still streaming (the server sees the request closed)."""
        if self.tail is not None and not self.tail.done():
            self.tail.cancel()

    @property
    def tokens_per_s(self) -> float | None:
        n = len(self.ids) if self.n_tokens is None else self.n_tokens
        return n / self.stats.total_s if self.stats.total_s > 0 and n else None


def sentence_end_ids(lm: LoadedLM) -> set[int]:
    """Tokens whose text ends a sentence (".", "!", "?", possibly after a closing quote)."""
    n = int(getattr(lm.model.config, "vocab_size", 0))
    return {i for i in range(n) if lm.decode([i]).rstrip("\"')").endswith((".", "!", "?"))}


def word_continuation_ids(lm: LoadedLM, ends: set[int]) -> set[int]:
    """Tokens that go on the word before them ("'t", "ing"): decoded after a sentence end,
    they follow it with no space between."""
    dot = next((i for i in sorted(ends) if lm.decode([i]) == "."), None)
    if dot is None:
        return set()
    n = int(getattr(lm.model.config, "vocab_size", 0))
    out = set()
    for i in range(n):
        s = lm.decode([dot, i])
        if len(s) > 1 and (s[1].isalnum() or s[1] == "'"):
            out.add(i)
    return out


def reply_generator(seed: int | None, prompt: list[int]) -> torch.Generator:
    """The source of one reply's draws: seeded by ``seed`` and the prompt's ids, so a run is
    reproducible whatever order its replies come in; fresh randomness when ``seed`` is None."""
    g = torch.Generator()
    if seed is None:
        g.seed()
    else:
        digest = hashlib.blake2b(repr((seed, prompt)).encode(), digest_size=8).digest()
        g.manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))
    return g


class Responder:
    warm_start = True  # `agenerate(prev=...)` re-denoises a previous block (masked LMs)
    # where generation runs off the event loop: an object with ``async run(fn, *args)`` (the
    # agent gives each engine a bounded pool, `voice.workers`); None: asyncio's default executor
    workers: Any = None

    def __init__(self, lm: LoadedLM, cfg: LlmConfig, probe_lm: LoadedLM | None = None,
                 turn_end_lm: TurnEndLM | None = None) -> None:
        self.lm = lm
        self.cfg = cfg
        self.blocks = None
        if lm.kind == "bdlm":
            ends = sentence_end_ids(lm)
            self.blocks = BlockDiffusionDecoder(lm.model, lm.special, ends, word_continuation_ids(lm, ends))
        self.probe_lm = probe_lm or lm
        # the LM's end-of-turn reader: the turn-end LM, or a probe on a masked LM's hidden state
        self.turn_end: TurnEndLM | TurnEndProbe | None = turn_end_lm
        probe_dir = self.probe_lm.path
        if turn_end_lm is None and probe_dir.is_dir():
            self.turn_end = TurnEndProbe.load(probe_dir)
            if self.turn_end is not None:
                self.turn_end.prepare(self.probe_lm)  # now, not on a call's first hypothesis

    @property
    def streams(self) -> bool:
        """`agenerate(ready=...)` returns once the reply's start satisfies ``ready`` and the rest
        follows in `Reply.tail`, never cut inside a sentence (the block LM with ``llm.stream``);
        a masked LM's block comes whole."""
        return self.blocks is not None and self.cfg.stream

    @property
    def name(self) -> str:
        """The reply model, as plugins report it: ``voice-agent-bdlm`` for the embedded one."""
        return f"voice-agent-{self.lm.kind}"

    @classmethod
    def load(cls, cfg: LlmConfig | None = None, turn_end: bool = True) -> Responder:
        """``turn_end=False``: replies only, no end-of-turn probe (and no second model for it)."""
        cfg = cfg or LlmConfig()
        try:
            lm = load_lm(cfg)
        except ModelLoadError as exc:
            raise ModelLoadError(f"llm.model_path: {exc}") from None
        probe_lm, turn_end_lm = None, None
        if turn_end and not (lm.path / PROBE_FILE).exists():
            probe_path = Path(cfg.turn_end_model_path).expanduser() if cfg.turn_end_model_path else EMBEDDED_MDLM
            try:
                if (probe_path / CALIBRATION_FILE).exists():
                    turn_end_lm = TurnEndLM.load(probe_path)
                else:  # the probe was fitted on float32 features
                    probe_lm = load_lm(LlmConfig(model_path=str(probe_path), dtype="float32", threads=cfg.threads))
            except ModelLoadError as exc:
                raise ModelLoadError(f"llm.turn_end_model_path: {exc}") from None
        return cls(lm, cfg, probe_lm, turn_end_lm)

    def block_options(self, deadline: float | None = None, prompt: list[int] | None = None,
                      **overrides: object) -> BlockOptions:
        """``prompt``: the reply's prompt ids, which seed its draws when ``llm.seed`` is set."""
        kw: dict[str, object] = {"block": self.cfg.block_len, "tau": self.cfg.tau, "max_passes": self.cfg.steps,
                                 "max_tokens": self.cfg.max_tokens, "min_tokens": self.cfg.min_tokens,
                                 "guidance": self.cfg.guidance, "deadline": deadline,
                                 "temperature": self.cfg.temperature, "top_p": self.cfg.top_p}
        kw.update(overrides)
        if float(kw["temperature"]) > 0.0 and "generator" not in overrides:  # type: ignore[arg-type]
            kw["generator"] = reply_generator(self.cfg.seed, prompt or [])
        return BlockOptions(**kw)  # type: ignore[arg-type]

    def options(self, deadline: float | None = None, **overrides: object) -> DecodeOptions:
        """Decoder options from the config: every `LlmConfig` field named like a
        `DecodeOptions` field is used, so a decoder option added to the config takes effect."""
        kw: dict[str, object] = {
            f.name: getattr(self.cfg, f.name) for f in fields(DecodeOptions) if hasattr(self.cfg, f.name)
        }
        kw["deadline"] = deadline
        kw.update(overrides)
        return DecodeOptions(**kw)  # type: ignore[arg-type]

    def turn_end_prob(self, user_text: str) -> float | None:
        """Blocking: the LM's probability that ``user_text`` is a whole turn (None: this model
        has no probe, see `llm.turn_end`)."""
        if self.turn_end is None:
            return None
        if isinstance(self.turn_end, TurnEndLM):
            return self.turn_end.prob(user_text)
        return self.turn_end.probs(self.probe_lm, [user_text])[0]

    def visible_history(self, history: list[tuple[str, str]] | tuple = ()) -> list[tuple[str, str]]:
        """The part of the conversation the prompt holds (``llm.history_turns`` turns): all
        of the history that shapes a reply, and so all of it a reply cache must key on."""
        return list(history)[-self.cfg.history_turns :] if self.cfg.history_turns else []

    def _prompt(self, text: str, history: list[tuple[str, str]] | tuple = ()) -> list[int]:
        return self.lm.prompt_ids(text, self.visible_history(history), self.cfg.prompt_len)

    def text_of(self, ids: list[int]) -> str:
        """A reply's text from its tokens, each sentence begun upper case (`llm.sentence_case`)."""
        return sentence_case(self.lm.decode(ids))

    def _reply(self, res: BlockResult, text: str, remasked: int = -1) -> Reply:
        return Reply(self.text_of(res.ids), res.ids, res.block, res.confidence, res.stats, text, remasked)

    def generate(
        self,
        user_text: str,
        history: list[tuple[str, str]] | tuple = (),
        deadline_s: float | None = None,
        cancel: threading.Event | None = None,
        on_pass: Callable[[list[int]], bool] | None = None,
        **overrides: object,
    ) -> Reply:
        """Blocking. ``deadline_s`` is a budget in seconds from now (anytime decoding).
        ``on_pass`` (block LM only): see `BlockDiffusionDecoder.generate`."""
        deadline = time.perf_counter() + deadline_s if deadline_s is not None else None
        stop = cancel.is_set if cancel else None
        prompt = self._prompt(user_text, history)
        if self.blocks is not None:
            res = self.blocks.generate(prompt, self.block_options(deadline, prompt, **overrides), should_stop=stop,
                                       unprompted=[prompt[0], prompt[-1]],  # <bos> <agent>: no words
                                       on_pass=on_pass)
        else:
            res = generate_block(self.lm.logits_fn, prompt, self.lm.special, self.options(deadline, **overrides),
                                 should_stop=stop)
        return self._reply(res, user_text)

    def generate_batch(self, texts: list[str], deadline_s: float | None = None, **overrides: object) -> list[Reply]:
        if self.blocks is not None:  # one call at a time; each gets the whole budget
            return [self.generate(t, deadline_s=deadline_s, **overrides) for t in texts]
        deadline = time.perf_counter() + deadline_s if deadline_s is not None else None
        res = generate_blocks(
            self.lm.logits_fn, [self._prompt(t) for t in texts], self.lm.special, self.options(deadline, **overrides)
        )
        return [self._reply(r, t) for r, t in zip(res, texts, strict=True)]

    def redenoise(
        self,
        prev: Reply,
        user_text: str,
        history: list[tuple[str, str]] | tuple = (),
        keep_threshold: float = 0.2,
        deadline_s: float | None = None,
        cancel: threading.Event | None = None,
        drop_ratio: float = 0.5,
    ) -> Reply:
        """Warm start from ``prev`` for a changed prompt. One scoring pass (a batch of two) with
        the new prompt finds the positions that depend on the change (their best outcome moved, or their
        token lost more than ``drop_ratio`` of its probability) and those that are not
        confident (below ``keep_threshold``); only those are re-masked and re-decoded, with a
        pass budget scaled to their share of the block. The end token and the padding after it
        count as one outcome, "the reply ends here", as in the decoder: if the end token is
        re-masked, so is everything after it, and the reply may grow."""
        if self.blocks is not None:  # blocks are decoded left to right from the prompt: nothing to keep
            return self.generate(user_text, history, deadline_s, cancel)
        deadline = time.perf_counter() + deadline_s if deadline_s is not None else None
        prompt = self._prompt(user_text, history)
        sp = self.lm.special
        block = list(prev.block)
        if len(block) != self.cfg.block_len or len(prev.confidence) != len(block):
            raise ValueError(f"previous block has {len(block)} positions, the config says {self.cfg.block_len}")
        end_at = block.index(sp.eot) if sp.eot in block else len(block)
        # A masked LM is trained to predict masked positions only, so each kept token is scored
        # with its own position masked: one batch of two rows, the even positions masked in one
        # and the odd ones in the other (each token seen against its new prompt and the rest of
        # the block, as a pseudo-likelihood).
        rows = torch.tensor([prompt + block, prompt + block])
        scored = min(end_at + 1, len(block))
        for j in range(scored):
            rows[j % 2, len(prompt) + j] = sp.mask
        with torch.no_grad():
            both = self.lm.logits_fn(rows, torch.ones_like(rows), len(prompt)).float().softmax(-1)
        probs = torch.stack([both[j % 2, j] for j in range(len(block))])
        ends = sp.end_ids
        p_end = probs[:, ends].sum(-1)
        words = probs.clone()
        words[:, [sp.mask, *sp.forbidden, *ends]] = 0.0
        best_word = words.max(-1)
        remask = [False] * len(block)
        for j in range(end_at + 1 if end_at < len(block) else len(block)):
            tok = block[j]
            if tok == sp.eot:
                p_tok, moved = float(p_end[j]), float(p_end[j]) < float(best_word.values[j])
            else:
                p_tok = float(probs[j, tok])
                moved = int(best_word.indices[j]) != tok or float(p_end[j]) > float(best_word.values[j])
            dropped = p_tok < drop_ratio * prev.confidence[j]
            remask[j] = moved or dropped or p_tok < keep_threshold
        if end_at < len(block) and remask[end_at]:
            remask[end_at:] = [True] * (len(block) - end_at)  # the reply may now run longer
        share = sum(remask) / len(block)
        steps = max(1, math.ceil(self.cfg.steps * share))
        opts = self.options(deadline, steps=steps, min_steps=min(steps, self.cfg.min_steps))
        res = generate_block(
            self.lm.logits_fn, prompt, sp, opts, init_block=block, remask=remask,
            should_stop=cancel.is_set if cancel else None,
        )
        return self._reply(res, user_text, remasked=sum(remask))

    async def agenerate(
        self, user_text: str, history: list[tuple[str, str]] | tuple = (), deadline_s: float | None = None,
        prev: Reply | None = None, ready: Callable[[str], bool] | None = None,
    ) -> Reply:
        """Async and cancellable: cancelling the awaiting task stops the worker at the next
        denoising pass (torch cannot be interrupted mid-pass). With ``ready`` and `streams`, see
        `_streamed`; otherwise the reply comes whole."""
        cancel = threading.Event()
        run = self.workers.run if self.workers is not None else asyncio.to_thread
        if ready is not None and self.streams:
            return await self._streamed(run, user_text, history, deadline_s, cancel, ready)
        if prev is not None and self.blocks is None:
            fut = run(self.redenoise, prev, user_text, history, deadline_s=deadline_s, cancel=cancel)
        else:
            fut = run(self.generate, user_text, history, deadline_s, cancel)
        try:
            return await fut
        finally:
            cancel.set()

    async def _streamed(
        self, run: Callable[..., Any], user_text: str, history: list[tuple[str, str]] | tuple,
        deadline_s: float | None, cancel: threading.Event, ready: Callable[[str], bool],
    ) -> Reply:
        """The reply returned as soon as its text so far satisfies ``ready`` (called in the worker
        thread after each pass, so it must be a pure function of the text), as a streamed remote
        reply is, and `Reply.tail` decodes the rest in the same worker and gives the whole text
        (`Reply.cancel` stops it). Past ``deadline_s`` the reply ends at the first sentence end
        after what was handed over, never inside a sentence (`BlockDiffusionDecoder.generate`).
        A reply that ends first comes whole, with no tail."""
        loop = asyncio.get_running_loop()
        start: asyncio.Future[list[int]] = loop.create_future()

        def hand_over(ids: list[int]) -> None:
            if not start.done():
                start.set_result(ids)

        def on_pass(ids: list[int]) -> bool:
            if not ids or not ready(self.text_of(ids)):
                return False
            loop.call_soon_threadsafe(hand_over, list(ids))
            return True

        whole = asyncio.ensure_future(run(self.generate, user_text, history, deadline_s, cancel, on_pass))
        try:
            await asyncio.wait({whole, start}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            cancel.set()
            whole.cancel()
            raise
        if whole.done():
            return whole.result()  # it ended (or failed) before its start was handed over
        ids = start.result()
        reply = Reply(self.text_of(ids), ids, ids, [], DecodeStats(), user_text)
        reply.tail = asyncio.ensure_future(self._rest(whole, reply))

        def stop(tail: asyncio.Future[str]) -> None:  # also when cancelled before it first ran
            if tail.cancelled():
                cancel.set()  # the worker stops at its next pass
                whole.cancel()

        reply.tail.add_done_callback(stop)
        return reply

    @staticmethod
    async def _rest(whole: asyncio.Future[Reply], reply: Reply) -> str:
        """The tail of a reply returned at its first clause: the whole text once decoded, with
        the reply's tokens and statistics (its ``text`` stays what was returned). A failure
        after that point keeps what was returned, in ``reply.error``."""
        try:
            done = await whole
        except Exception as exc:
            reply.error = exc
            log.warning("llm: reply cut short after %r: %s", reply.text, exc)
            return reply.text
        reply.ids, reply.block, reply.confidence, reply.stats = done.ids, done.block, done.confidence, done.stats
        return done.text
