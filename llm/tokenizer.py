"""Byte-level BPE tokenizer trained on the dialogue corpus, with the special tokens the
diffusion decoder needs (mask, end-of-turn, pad) and the chat layout both models share."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

PAD = "<pad>"
BOS = "<bos>"
SEP = "<agent>"  # separates the caller's words from the agent's reply
EOT = "<eot>"  # end of the agent's turn
MASK = "<mask>"
UNK = "<unk>"
SPECIAL_TOKENS = [PAD, BOS, SEP, EOT, MASK, UNK]


@dataclass(frozen=True)
class SpecialIds:
    pad: int
    bos: int
    sep: int
    eot: int
    mask: int


class ChatTokenizer:
    """Wraps a `tokenizers.Tokenizer` and knows the chat layout:

    ``<bos> caller words <agent> reply words <eot> <pad>...``
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tk = tokenizer
        ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
        missing = [t for t, i in ids.items() if i is None]
        if missing:
            raise ValueError(f"tokenizer lacks special tokens {missing}")
        self.special = SpecialIds(ids[PAD], ids[BOS], ids[SEP], ids[EOT], ids[MASK])

    @property
    def vocab_size(self) -> int:
        return self.tk.get_vocab_size()

    @classmethod
    def load(cls, path: str | Path) -> ChatTokenizer:
        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.exists():
            raise FileNotFoundError(f"tokenizer file not found: {p}")
        return cls(Tokenizer.from_file(str(p)))

    def save(self, directory: str | Path) -> None:
        self.tk.save(str(Path(directory) / "tokenizer.json"))

    def encode(self, text: str) -> list[int]:
        return self.tk.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        sp = {self.special.pad, self.special.bos, self.special.sep, self.special.eot, self.special.mask}
        return self.tk.decode([i for i in ids if i not in sp]).strip()

    def prompt_ids(self, user_text: str, max_len: int) -> list[int]:
        """``<bos> words <agent>``, keeping the most recent words when too long."""
        body = self.encode(" " + user_text.strip())[-(max_len - 2):]
        return [self.special.bos, *body, self.special.sep]


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> ChatTokenizer:
    tk = Tokenizer(models.BPE(unk_token=UNK))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
    )
    tk.train_from_iterator(texts, trainer=trainer)
    return ChatTokenizer(tk)
