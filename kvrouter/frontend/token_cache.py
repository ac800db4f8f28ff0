"""Token ids of text encoded before, so a prompt that repeats what earlier
requests sent (a chat's earlier turns, a shared system prompt, the same
prompt again) is not encoded again.

The text is cut at the tokenizer's added tokens (`<|im_start|>` and the
like), and each piece between them is looked up on its own. That is exact:
`tokenizers` itself splits the text there first and normalizes and
pre-tokenizes each piece alone, so a piece's ids do not depend on what
surrounds it. A tokenizer for which that does not hold is used uncut, the
whole text one piece:

- an added token that strips the whitespace beside it, matches whole words
  only, or is matched after normalization (where it is found depends on
  its neighbours);
- a `Metaspace` pre-tokenizer or a `Prepend` normalizer, which may treat
  the text's first piece differently from the others.

The post-processor's tokens (a bos, say) are worked out once, from probes,
as the ids it puts before and after a text's own; a post-processor that
does something else is applied by encoding the whole text, uncached.

The cache is a least-recently-used map from piece to ids, bounded by the
tokens it holds; its ids are kept as 4-byte arrays."""

from __future__ import annotations

import json
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable

from tokenizers import Tokenizer

# Pieces shorter than this are encoded whatever the cache holds: looking
# them up would cost about as much, and they would crowd it.
MIN_PIECE_CHARS = 16
PROBES = ("kvrouter", "a b  c\n", "  x")

Encode = Callable[[list[str]], list[list[int]]]


class TokenCache:
    """Thread-safe: the event loop looks pieces up while pool threads add
    them."""

    def __init__(self, tokenizer: Tokenizer, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[str, array] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()
        self._split = _splitter(tokenizer)
        self._affixes = _post_processor_affixes(tokenizer)

    @property
    def tokens(self) -> int:
        """The tokens it holds, at most `max_tokens`."""
        return self._tokens

    def encode(self, text: str, add_special_tokens: bool, encode: Encode | None) -> array | None:
        """`text`'s ids, as an array('I'), encoding with `encode` (texts to
        their ids, with no added special tokens) the pieces not cached. With
        `encode` None, only if every piece is cached: cheap enough to try on
        the event loop before handing the work to a pool. None also when
        only encoding the whole text with its special tokens will do."""
        if add_special_tokens and self._affixes is None:
            return None
        pieces = self._split(text)
        with self._lock:
            known = [self._lookup(piece) for piece in pieces]
        missing = list(dict.fromkeys(p for p, k in zip(pieces, known, strict=True) if k is None))
        if missing and encode is None:
            return None
        fresh = dict(zip(missing, encode(missing), strict=True)) if missing else {}
        ids = array("I", self._affixes[0]) if add_special_tokens else array("I")
        for piece, found in zip(pieces, known, strict=True):
            if found is None:
                ids.fromlist(fresh[piece])
            else:
                ids += found
        if fresh:
            self._add(fresh)
        if add_special_tokens:
            ids.fromlist(self._affixes[1])
        return ids

    def _lookup(self, piece: str | int) -> array | None:
        if isinstance(piece, int):
            return array("I", (piece,))
        if len(piece) < MIN_PIECE_CHARS:
            return None
        entry = self._entries.get(piece)
        if entry is None:
            return None
        self._entries.move_to_end(piece)
        return entry

    def _add(self, fresh: dict[str, list[int]]) -> None:
        with self._lock:
            for piece, ids in fresh.items():
                if len(piece) < MIN_PIECE_CHARS or len(ids) > self.max_tokens:
                    continue
                if piece in self._entries:
                    continue
                self._entries[piece] = array("I", ids)
                self._tokens += len(ids)
            while self._tokens > self.max_tokens:
                _, evicted = self._entries.popitem(last=False)
                self._tokens -= len(evicted)


def _splitter(tokenizer: Tokenizer) -> Callable[[str], list[str | int]]:
    """Text to its pieces: strings, and the ids of the added tokens between
    them; the whole text as one piece where cutting would not be exact."""
    config = json.loads(tokenizer.to_str())
    added = config.get("added_tokens") or []
    cuttable = (
        all(
            not (t.get("lstrip") or t.get("rstrip") or t.get("single_word") or t.get("normalized"))
            for t in added
        )
        and not _mentions(config.get("pre_tokenizer"), "Metaspace")
        and not _mentions(config.get("normalizer"), "Prepend")
    )
    if not added or not cuttable:
        return lambda text: [text] if text else []
    ids = {t["content"]: t["id"] for t in added}
    # Longest first: the tokenizer takes the longest added token that starts
    # where the leftmost match starts.
    pattern = re.compile(
        "(" + "|".join(re.escape(c) for c in sorted(ids, key=len, reverse=True)) + ")"
    )

    def split(text: str) -> list[str | int]:
        pieces: list[str | int] = []
        for i, part in enumerate(pattern.split(text)):
            if i % 2:
                pieces.append(ids[part])
            elif part:
                pieces.append(part)
        return pieces

    return split


def _mentions(component: object, kind: str) -> bool:
    """Whether a tokenizer.json component, or one in its sequence, is `kind`."""
    if isinstance(component, dict):
        return component.get("type") == kind or any(_mentions(v, kind) for v in component.values())
    if isinstance(component, list):
        return any(_mentions(v, kind) for v in component)
    return False


def _post_processor_affixes(tokenizer: Tokenizer) -> tuple[list[int], list[int]] | None:
    """The ids the post-processor puts before and after a text's own, the
    same for every probe; None if it does anything else."""
    found = set()
    for probe in PROBES:
        (plain,) = tokenizer.encode_batch_fast([probe], add_special_tokens=False)
        (full,) = tokenizer.encode_batch_fast([probe], add_special_tokens=True)
        plain_ids, full_ids = plain.ids, full.ids
        starts = [
            i
            for i in range(len(full_ids) - len(plain_ids) + 1)
            if full_ids[i : i + len(plain_ids)] == plain_ids
        ]
        if len(starts) != 1:
            return None
        start = starts[0]
        found.add((tuple(full_ids[:start]), tuple(full_ids[start + len(plain_ids) :])))
    if len(found) != 1:
        return None
    before, after = found.pop()
    return list(before), list(after)
