"""Held-out reply quality, computed the same way for the diffusion and the AR model.

No single number is safe on its own: a collapsed model that always answers "I." scores a
fair token F1 against chit-chat references, and a degenerate one that fills its block with
"...." scores a long mean length. So a report carries several measures:

- token F1 against the reference reply (SQuAD-style: lower case, punctuation dropped);
- mean reply length in words and the share of empty replies;
- distinct-2 over all replies (unique word bigrams / bigrams): low when every prompt gets the
  same reply or a reply repeats itself;
- the share of replies with the same token twice in a row (the parallel-decoding failure),
  and self distinct-2 (unique bigrams within a reply, averaged): low when a reply loops
  ("I'm not a good. I'm not a good.");
- with a `Lexicon` of the training replies: the share of reply words that are real words of
  the corpus and of word trigrams that the corpus attests. Parallel decoding of a weak model
  glues word pieces into non-words ("you't") and salad ("to a the you"); human replies to
  held-out prompts score about 0.99 and 0.5, a looping model near 1.0 on both (which is why
  self distinct-2 is there too);
- judge NLL: the per-token negative log-likelihood of each reply under a judge model (the
  *other* model of the pair): degenerate text costs a lot under any reasonable LM.

`judge_nll_mdlm` scores with a masked LM by pseudo-likelihood: each reply position is masked
in turn with the rest of the reply visible, the way the MDLM was trained to fill a block.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import torch

from llm.decoder import LogitsFn, SpecialTokens

_WORD = re.compile(r"[a-z0-9']+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower().replace("’", "'"))


def token_f1(hyp: str, ref: str) -> float:
    h, r = words(hyp), words(ref)
    if not h or not r:
        return float(h == r)
    common = sum((Counter(h) & Counter(r)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(h), common / len(r)
    return 2 * precision * recall / (precision + recall)


def distinct_n(texts: Sequence[str], n: int = 2) -> float:
    grams: list[tuple[str, ...]] = []
    for t in texts:
        w = words(t)
        grams += [tuple(w[i : i + n]) for i in range(len(w) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


_SENTENCE = re.compile(r"[^.!?]+[.!?]*")


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.findall(text) if s.strip()]


def repeats(text: str) -> bool:
    """A word or a pair of words said twice in a row ("the the", "go to go to"), or a sentence
    said twice: what a caller hears as a stutter."""
    w = words(text)
    if any(a == b for a, b in zip(w, w[1:], strict=False)):
        return True
    if any(w[i : i + 2] == w[i + 2 : i + 4] for i in range(len(w) - 3)):
        return True
    said = [" ".join(words(s)) for s in sentences(text)]
    said = [s for s in said if s]
    return len(said) != len(set(said))


def has_adjacent_repeat(ids: Sequence[int]) -> bool:
    return any(a == b for a, b in zip(ids, ids[1:], strict=False))


def self_distinct_2(text: str) -> float | None:
    """Unique word bigrams / bigrams within one reply; None for replies under three words."""
    w = words(text)
    if len(w) < 3:
        return None
    grams = list(zip(w, w[1:], strict=False))
    return len(set(grams)) / len(grams)


class Lexicon:
    """Words and word trigrams of a training corpus, each seen at least ``min_count`` times
    (typos and one-off glue in the corpus do not count as attested). Build it from the
    replies only: each chit-chat turn is also the next pair's prompt, and counting both would
    count every trigram twice."""

    def __init__(self, texts: Iterable[str], min_count: int = 2) -> None:
        wc: Counter[str] = Counter()
        tc: Counter[int] = Counter()  # hashes: a few million trigram tuples would cost too much memory
        for t in texts:
            w = words(t)
            wc.update(w)
            tc.update(hash(g) for g in zip(w, w[1:], w[2:], strict=False))
        self.words = {w for w, c in wc.items() if c >= min_count}
        self.trigrams = {g for g, c in tc.items() if c >= min_count}

    def known_share(self, texts: Sequence[str]) -> float:
        ws = [x for t in texts for x in words(t)]
        return sum(x in self.words for x in ws) / len(ws) if ws else 0.0

    def attested_share(self, texts: Sequence[str]) -> float:
        grams = [g for t in texts for g in _trigrams(words(t))]
        return sum(hash(g) in self.trigrams for g in grams) / len(grams) if grams else 0.0


def _trigrams(w: list[str]) -> list[tuple[str, str, str]]:
    return list(zip(w, w[1:], w[2:], strict=False))


@dataclass
class QualityReport:
    n: int
    token_f1: float
    token_f1_se: float  # standard error of the mean F1 over prompts
    mean_words: float
    empty_share: float
    distinct_2: float
    adjacent_repeat_share: float
    self_distinct_2: float  # mean over replies of three words or more; 1.0 when there are none
    known_word_share: float  # NaN without a lexicon
    attested_trigram_share: float  # NaN without a lexicon
    judge_nll: float  # mean over non-empty replies; NaN when there is no judge
    ended_share: float  # replies that produced an end token inside the block

    def as_dict(self) -> dict[str, float]:
        return {k: (round(v, 4) if isinstance(v, float) and math.isfinite(v) else v) for k, v in asdict(self).items()}


def quality_report(
    replies: Sequence[str],
    references: Sequence[str],
    reply_ids: Sequence[Sequence[int]],
    ended: Sequence[bool],
    judge_nll: Sequence[float] | None = None,
    lexicon: Lexicon | None = None,
) -> QualityReport:
    if not (len(replies) == len(references) == len(reply_ids) == len(ended)):
        raise ValueError("replies, references, reply_ids and ended must have the same length")
    n = len(replies)
    if n == 0:
        raise ValueError("no replies to score")
    f1 = [token_f1(h, r) for h, r in zip(replies, references, strict=True)]
    se = statistics.stdev(f1) / math.sqrt(n) if n > 1 else 0.0
    nll = [x for x in (judge_nll or []) if math.isfinite(x)]
    sd2 = [x for x in (self_distinct_2(t) for t in replies) if x is not None]
    return QualityReport(
        n=n,
        token_f1=sum(f1) / n,
        token_f1_se=se,
        mean_words=sum(len(words(t)) for t in replies) / n,
        empty_share=sum(not words(t) for t in replies) / n,
        distinct_2=distinct_n(replies, 2),
        adjacent_repeat_share=sum(has_adjacent_repeat(i) for i in reply_ids) / n,
        self_distinct_2=sum(sd2) / len(sd2) if sd2 else 1.0,
        known_word_share=lexicon.known_share(replies) if lexicon else float("nan"),
        attested_trigram_share=lexicon.attested_share(replies) if lexicon else float("nan"),
        judge_nll=sum(nll) / len(nll) if nll else float("nan"),
        ended_share=sum(ended) / n,
    )


def paired_f1_diff(
    replies_a: Sequence[str], replies_b: Sequence[str], references: Sequence[str]
) -> tuple[float, float]:
    """Mean and standard error of F1(a) - F1(b) over the same prompts."""
    d = [token_f1(a, r) - token_f1(b, r) for a, b, r in zip(replies_a, replies_b, references, strict=True)]
    if len(d) < 2:
        return (d[0] if d else 0.0), 0.0
    return sum(d) / len(d), statistics.stdev(d) / math.sqrt(len(d))


def at_least_as_good(
    diff: QualityReport, ar: QualityReport, f1_diff: tuple[float, float], human: QualityReport | None = None,
    ar_judge_nll: float | None = None,
) -> bool:
    """The rule the benchmark uses for "equal or better quality": no measure notably worse than
    the AR model's. Fluency first: with ``ar_judge_nll`` (the AR model's own replies under the
    same judge as ``diff.judge_nll``), the judge NLL at most 1.1x that, since short broken
    replies can win token F1. Token F1 not lower by more than one paired standard error; distinct-2 at
    least 80 % of AR's; self distinct-2 at most 0.1 lower; mean length at least half of AR's;
    empty replies at most 5 points more; known words at most 5 points and attested trigrams at
    most 15 points fewer (when a lexicon was used). Where the human replies (``human``) score
    lower than AR on a measure, the bar is theirs: no model has to be more generic than people."""

    def bar(name: str) -> float:
        a = getattr(ar, name)
        return min(a, getattr(human, name)) if human is not None and math.isfinite(getattr(human, name)) else a

    mean, se = f1_diff
    ok = (
        mean >= -se
        and diff.distinct_2 >= 0.8 * bar("distinct_2")
        and diff.self_distinct_2 >= bar("self_distinct_2") - 0.1
        and diff.mean_words >= 0.5 * bar("mean_words")
        and diff.empty_share <= ar.empty_share + 0.05
    )
    if ar_judge_nll is not None:
        ok = ok and math.isfinite(diff.judge_nll) and diff.judge_nll <= 1.1 * ar_judge_nll
    if math.isfinite(diff.known_word_share) and math.isfinite(ar.known_word_share):
        ok = ok and diff.known_word_share >= bar("known_word_share") - 0.05
        ok = ok and diff.attested_trigram_share >= bar("attested_trigram_share") - 0.15
    return ok


@torch.no_grad()
def judge_nll_mdlm(
    logits_fn: LogitsFn,
    special: SpecialTokens,
    prompts: Sequence[Sequence[int]],
    replies: Sequence[Sequence[int]],
    ended: Sequence[bool],
    block_len: int,
) -> list[float]:
    """Pseudo-NLL per token under a masked diffusion LM: the reply (plus its end token when it
    ended) is laid out in a block padded as in training, and every scored position is masked
    in turn, all in one batch per reply."""
    out: list[float] = []
    for p, r, e in zip(prompts, replies, ended, strict=True):
        target = list(r)[:block_len] + ([special.eot] if e and len(r) < block_len else [])
        if not target:
            out.append(float("nan"))
            continue
        block = target + [special.pad] * (block_len - len(target))
        m = len(target)
        ids = torch.tensor([list(p) + block] * m, dtype=torch.long)
        start = len(p)
        rows = torch.arange(m)
        ids[rows, start + rows] = special.mask
        logits = logits_fn(ids, torch.ones_like(ids), start).float()
        lp = logits[rows, rows].log_softmax(-1)[rows, torch.tensor(target)]
        out.append(float(-lp.mean()))
    return out
