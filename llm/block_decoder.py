"""Decoding a block diffusion LM (`llm.block_lm`): blocks left to right, each denoised in
parallel, finished blocks cached.

For each block of ``block`` positions, all masks at first:

- a pass runs the block against the cached keys and values of the prompt and the finished
  blocks (bidirectional inside the block); the first position is scored by the last
  finished position, the others by the position before them (shifted, as in training);
- with ``guidance`` w > 0, the pass also reads the block after ``<bos> <agent>`` alone (one
  batch of two rows) and scores ``(1 + w) * prompted - w * unprompted`` (classifier-free
  guidance): replies about the caller's words rather than stock ones;
- every masked position whose most likely token has probability >= ``tau`` is committed,
  and always at least the leftmost open one (Fast-dLLM's threshold rule): a confident
  model fills a block in one or two passes, an unsure one falls back to one token a pass,
  which is AR decoding; a position other than the leftmost joins a pass only beside a left
  neighbour known for sure (it was read with that neighbour masked: beside a guess it may
  fit another reading, "Hello" + the "i" of "Hi");
- ``no_adjacent_repeat``: a position never takes the token committed right before it, so
  parallel commits cannot stutter ("I I", "the the"); ``no_repeat_ngram`` (3): nor a token
  that would say again an n-gram the reply already holds ("to go to go to", a sentence said
  twice), the loop a small greedy LM falls into; a token that goes on the word before it
  ("'t" after "don") is never banned, as the loop is stopped at a word's first token and a
  ban inside a word leaves it broken ("I don't think I don");
- the reply ends at the first end-of-turn token with nothing masked before it, and not before
  ``min_tokens`` tokens (a one-word "Hey!" to a caller's "Hello?");
- a finished block enters the cache in the same forward pass as the next block's first
  denoising pass (its rows causal, the new block's rows seeing it), so caching costs no
  pass of its own;
- anytime: once the wall-clock ``deadline`` has passed, the reply ends at the last sentence
  end (".", "!", "?") it already holds, or at the next one it writes; past ``overrun_s``
  more it ends where it is. A late reply is shorter, not broken (filling every open
  position at once, as a masked LM's anytime decoder does, measured 47 % grammatical at a
  40 ms deadline against 97 % without one);
- streamed (``on_pass``): the reply's start is handed over (to speech) as soon as the caller
  of `generate` says it is enough; a late reply still ends at a sentence end (after what was
  handed over), but never where it is: past ``overrun_s`` it goes on to the handover and to
  the end of the sentence it is in;
- ``max_passes`` caps the passes a block gets (the last one fills what is left);
- ``temperature`` > 0: the leftmost open position, the one a pass commits even when unsure,
  is drawn from its allowed candidates (probabilities to the power 1/T, the nucleus of mass
  ``top_p``) with ``generator``, not taken greedily: the same choice an AR model's sampler
  makes, where the model hesitates between replies ("Goodbye!" / "Have a great day."); the
  positions committed for being at least ``tau`` sure stay greedy.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from transformers import DynamicCache, GPT2LMHeadModel

from llm.decoder import BlockResult, DecodeCancelled, DecodeStats, SpecialTokens


@dataclass(frozen=True)
class BlockOptions:
    block: int = 8
    tau: float = 0.9
    max_passes: int = 8  # per block
    max_tokens: int = 32
    min_tokens: int = 0  # no end of turn before this many reply tokens
    no_adjacent_repeat: bool = True
    no_repeat_ngram: int = 3  # 0: allowed
    deadline: float | None = None  # absolute time.perf_counter() value
    overrun_s: float = 0.06  # after the deadline, how long a sentence may take to finish
    guidance: float = 0.0  # w: logits (1 + w) * given the prompt - w * given no words (0: off)
    sure_left: bool = True  # commit beside a left neighbour known for sure only (else: anywhere over tau)
    temperature: float = 0.0  # > 0: the leftmost open position is sampled (0: greedy)
    top_p: float = 1.0  # the nucleus it is sampled from
    generator: torch.Generator | None = None  # the draws' source (None: torch's global one)

    def __post_init__(self) -> None:
        if self.block < 1 or self.max_passes < 1 or self.max_tokens < 1:
            raise ValueError("block, max_passes and max_tokens must be positive")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError("tau must be in (0, 1]")
        if self.temperature < 0.0 or not 0.0 < self.top_p <= 1.0:
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")


class BlockDiffusionDecoder:
    def __init__(
        self, model: GPT2LMHeadModel, special: SpecialTokens, sentence_ends: set[int] | None = None,
        continuations: set[int] | None = None,
    ) -> None:
        self.model = model.eval()
        self.special = special
        self.sentence_ends = sentence_ends or set()  # tokens that end a sentence
        self.continuations = continuations or set()  # tokens that go on the word before them
        self._never = torch.tensor(sorted({special.mask, special.pad, *special.forbidden}))

    def _forward(self, ids: list[int], start_pos: int, cache: DynamicCache, causal_rows: int) -> torch.Tensor:
        """Runs ``ids`` at positions ``start_pos...`` against ``cache``; the first
        ``causal_rows`` rows are causal (a finished block entering the cache), the rest see
        each other and those rows. Returns the hidden states [len(ids), H]."""
        return self._forward_rows(ids, cache, causal_rows, [(start_pos, 0)])[0]

    def _forward_rows(self, ids: list[int], cache: DynamicCache, causal_rows: int,
                      rows: list[tuple[int, int]]) -> torch.Tensor:
        """`_forward` for a batch of sequences sharing ``ids`` (a guided reply's prompted and
        unprompted readings): one ``(start_pos, dead)`` per row, ``dead`` the cache's leading key
        columns that row must not see (the padding in front of a shorter prompt). Returns
        [len(rows), len(ids), H]."""
        q, past = len(ids), cache.get_seq_length()
        mask = torch.ones((len(rows), 1, q, past + q), dtype=torch.bool)
        if causal_rows:
            mask[:, 0, :causal_rows, past : past + causal_rows] = torch.tril(
                torch.ones((causal_rows, causal_rows), dtype=torch.bool))
            mask[:, 0, :causal_rows, past + causal_rows :] = False
        for r, (_, dead) in enumerate(rows):
            mask[r, 0, :, :dead] = False
        out = self.model.transformer(
            input_ids=torch.tensor([ids] * len(rows)), attention_mask=mask,
            position_ids=torch.stack([torch.arange(p, p + q) for p, _ in rows]), cache=cache, use_cache=True,
        )
        return out.last_hidden_state

    def _guided_prompt(self, prompt: list[int], unprompted: list[int], cache: DynamicCache) -> torch.Tensor:
        """The prompt and the unprompted prompt in one batch of two, the shorter padded in front
        (its padding sees only itself and is never seen). Returns the last hidden state of each."""
        q, pad = len(prompt), len(prompt) - len(unprompted)
        ids = torch.tensor([prompt, [self.special.pad] * pad + unprompted])
        mask = torch.tril(torch.ones((q, q), dtype=torch.bool))[None, None].repeat(2, 1, 1, 1)
        mask[1, 0, :, :pad] = False
        mask[1, 0, :pad, :pad] = torch.eye(pad, dtype=torch.bool)
        pos = torch.stack([torch.arange(q), (torch.arange(q) - pad).clamp_min(0)])
        out = self.model.transformer(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache,
                                     use_cache=True)
        return out.last_hidden_state[:, -1]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(hidden).float()

    def _probs(self, logits: torch.Tensor, w: float) -> torch.Tensor:
        """``logits`` [1, P, V], or [2, P, V] for a guided reply: the prompted reading pushed
        away from the unprompted one by ``w`` (raw logits do: a row's constant shift cancels)."""
        logits = (1.0 + w) * logits[0] - w * logits[1] if len(logits) == 2 else logits[0]
        logits[:, self._never] = float("-inf")
        return logits.softmax(-1)

    @torch.no_grad()
    def generate(
        self, prompt: list[int], opts: BlockOptions, should_stop: Callable[[], bool] | None = None,
        unprompted: list[int] | None = None, on_pass: Callable[[list[int]], bool] | None = None,
    ) -> BlockResult:
        """``unprompted``: the prompt with its words taken out (``<bos> <agent>``), read beside
        it when ``opts.guidance`` is set (classifier-free guidance: what the caller's words make
        likelier than any reply would be, weighted up).

        ``on_pass``: called after each pass with the reply's tokens known so far (they never
        change after) until it returns True: the start of the reply has been handed over (to
        speech). With it, a late reply ends at the first sentence end it holds or writes
        after what was handed over, and never where it is (no ``overrun_s``): the whole text
        goes on from what is being said, and a sentence is never cut."""
        sp, b = self.special, opts.block
        handed: int | None = None  # tokens handed over (streamed)
        ends = set(sp.end_ids)
        t0 = time.perf_counter()
        stats = DecodeStats()
        guided = opts.guidance > 0.0 and unprompted is not None and len(unprompted) <= len(prompt)
        cache = DynamicCache()
        # each row's (position of the reply's first token, padding in front of its prompt)
        rows = [(len(prompt), 0)]
        if guided:
            assert unprompted is not None
            rows.append((len(unprompted), len(prompt) - len(unprompted)))
            first = self._logits(self._guided_prompt(prompt, unprompted, cache))[:, None]
        else:
            first = self._logits(self._forward_rows(prompt, cache, len(prompt), [(0, 0)])[:, -1:])
        # ``first`` [rows, 1, V] scores the next block's first position
        stats.steps += 1
        stats.step_times.append(time.perf_counter() - t0)
        out: list[int] = []
        conf: list[float] = []
        pending: list[int] = []  # a finished block not yet in the cache
        ended = stopped = False
        while not (ended or stopped) and len(out) < opts.max_tokens:
            n = min(b, opts.max_tokens - len(out))
            block: list[int | None] = [None] * n
            bconf = [0.0] * n
            for pass_no in range(opts.max_passes):
                if should_stop is not None and should_stop():
                    raise DecodeCancelled()
                ts = time.perf_counter()
                ids = pending + [sp.mask if t is None else t for t in block]
                done_n = len(out) - len(pending)
                hb = self._forward_rows(ids, cache, len(pending), [(start + done_n, dead) for start, dead in rows])
                cache.crop(-n)  # keep the finished block, drop the noisy one
                if pending:
                    first = self._logits(hb[:, len(pending) - 1 : len(pending)])
                    pending = []
                hb = hb[:, -n:]
                logits = torch.cat([first, self._logits(hb[:, :-1])], dim=1) if n > 1 else first
                probs = self._probs(logits, opts.guidance)
                now = time.perf_counter()
                late = opts.deadline is not None and now >= opts.deadline
                fill_all = pass_no == opts.max_passes - 1
                open_before = block.count(None)
                self._commit(block, bconf, probs, opts, fill_all, out)
                stats.steps += 1
                stats.tokens_per_step.append(open_before - block.count(None))
                stats.step_times.append(time.perf_counter() - ts)
                if on_pass is not None and handed is None:
                    known = out + list(itertools.takewhile(lambda t: t is not None and t not in ends, block))
                    if on_pass(known):
                        handed = len(known)
                stats.deadline_hit |= late
                if late:
                    known = out + list(itertools.takewhile(lambda t: t is not None, block))
                    said = handed or 0  # a cut never takes back what is being said
                    cut = max((i + 1 for i, t in enumerate(known) if t in self.sentence_ends and i + 1 >= said),
                              default=None)
                    # a streamed reply is never cut inside a sentence: it goes on to a sentence end
                    gone = on_pass is None and opts.deadline is not None and now >= opts.deadline + opts.overrun_s
                    if cut is not None or gone:
                        known = [t for t in known[: cut or len(known)] if t not in ends]
                        conf = (conf + bconf)[: len(known)]
                        out, ended, stopped = known, cut is not None, True
                        break
                end_at = next((i for i, t in enumerate(block) if t in ends), None)
                if end_at is not None and all(t is not None for t in block[:end_at]):
                    out += [t for t in block[:end_at] if t is not None]
                    conf += bconf[:end_at]
                    ended = True
                    break
                if all(t is not None for t in block):
                    done = [t for t in block if t is not None]
                    out += done
                    conf += bconf
                    pending = done
                    break
        stats.total_s = time.perf_counter() - t0
        return BlockResult(ids=out, block=out + ([sp.eot] if ended else []), confidence=conf, ended=ended, stats=stats)

    def _commit(
        self, block: list[int | None], bconf: list[float], probs: torch.Tensor, opts: BlockOptions, fill_all: bool,
        said: list[int],
    ) -> None:
        """Commits masked positions in place: the leftmost open one (so an unsure model
        decodes left to right, as the AR model it came from), plus every other at or above
        ``tau`` (all if ``fill_all``), most confident first. Each is picked against the
        neighbours committed so far, so two positions filled in one pass cannot repeat. An
        end token is taken only at the leftmost open position: the reply's length is decided
        left to right, and a block cannot collapse backwards from ends committed at its far
        side."""
        top_p, top_t = probs.topk(8, -1)
        ends = self.special.end_ids
        open_at = [i for i, t in enumerate(block) if t is None]
        leftmost = open_at[0]

        def allowed(i: int) -> Iterator[int]:
            """Ranks (into ``top_t[i]``, most likely first) of the tokens position ``i`` may take."""
            left = block[i - 1] if i > 0 else (said[-1] if said else None)
            right = block[i + 1] if i + 1 < len(block) else None
            banned = self._repeated_ngram_ends(said, block, i, opts.no_repeat_ngram)
            for k in range(top_t.shape[1]):
                t = int(top_t[i, k])
                if t in ends:
                    if i == leftmost and len(said) + i >= opts.min_tokens:
                        yield k
                elif (not opts.no_adjacent_repeat or t not in (left, right)) and (
                    t not in banned or t in self.continuations
                ):
                    yield k

        last = top_t.shape[1] - 1  # taken when no candidate is allowed

        def pick(i: int) -> tuple[int, float]:
            k = next(allowed(i), last)
            return int(top_t[i, k]), float(top_p[i, k])

        def draw(i: int) -> tuple[int, float]:
            ks = list(allowed(i)) or [last]
            w = top_p[i, ks].double() ** (1.0 / opts.temperature)
            w = w / w.sum()
            keep = int((w.cumsum(0) - w < opts.top_p).sum())  # the nucleus: the first tokens up to top_p
            k = ks[int(torch.multinomial(w[:keep], 1, generator=opts.generator))]
            return int(top_t[i, k]), float(top_p[i, k])

        t, p = draw(leftmost) if opts.temperature > 0.0 else pick(leftmost)
        block[leftmost], bconf[leftmost] = t, p
        if t in ends:  # the reply ends here: nothing after it is needed
            return
        rest = sorted(open_at[1:], key=lambda i: -pick(i)[1])
        # a position was read with its left neighbour masked: it joins this pass's commits only
        # where that neighbour is known now, and not as a guess (the leftmost taken below tau)
        guessed = p < opts.tau
        for i in rest:
            if opts.sure_left and not fill_all and (block[i - 1] is None or (guessed and i == leftmost + 1)):
                continue
            t, p = pick(i)
            if fill_all or p >= opts.tau:
                block[i], bconf[i] = t, p

    @staticmethod
    def _repeated_ngram_ends(said: list[int], block: list[int | None], i: int, n: int) -> set[int]:
        """Tokens that would end, at block position ``i``, an n-gram the reply already holds
        (only where the n-1 tokens right before ``i`` are known)."""
        seq: list[int | None] = [*said, *block[:i]]
        if n < 2 or len(seq) < n - 1 or None in seq[len(seq) - (n - 1):]:
            return set()
        head = seq[len(seq) - (n - 1):]
        return {
            t for k in range(len(seq) - n + 1)
            if seq[k : k + n - 1] == head and (t := seq[k + n - 1]) is not None
        }
