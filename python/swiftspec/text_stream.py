"""Incremental detokenization with stop strings, for streaming generation."""

from __future__ import annotations

from typing import Sequence


class TextStream:
    """Turns token ids, as they are committed, into final text pieces.

    Text is emitted only once it cannot change: a trailing incomplete UTF-8
    sequence (decoded as U+FFFD) and any suffix that could still grow into a
    stop string are held back. When a stop string appears, the text is cut
    before it and :attr:`stopped` becomes True. Special tokens are not shown.
    """

    def __init__(self, tokenizer, stop: Sequence[str] = ()):
        self._tokenizer = tokenizer
        self._stop = list(stop)
        self._ids: list[int] = []
        self._emitted = 0  # characters of the decoded text already handed out
        self.text = ""
        self.stopped = False

    def _decoded(self) -> str:
        return self._tokenizer.decode(self._ids, skip_special_tokens=True)

    def push(self, ids: Sequence[int]) -> str:
        """Adds committed tokens; returns the newly final text (may be "")."""
        if self.stopped:
            return ""
        self._ids.extend(int(t) for t in ids)
        full = self._decoded()
        for s in self._stop:
            cut = full.find(s)
            if cut != -1:
                self.stopped = True
                full = full[:cut]
        safe = len(full)
        if not self.stopped:
            while safe > 0 and full[safe - 1] == "\ufffd":
                safe -= 1
            for s in self._stop:  # hold back a suffix that is a prefix of a stop string
                for k in range(min(len(s) - 1, safe), 0, -1):
                    if full[safe - k : safe] == s[:k]:
                        safe -= k
                        break
        safe = max(safe, self._emitted)
        delta = full[self._emitted : safe]
        self._emitted = safe
        self.text = full[:safe]
        return delta

    def finish(self) -> str:
        """Flushes held-back text at the end of generation."""
        if self.stopped:
            return ""
        full = self._decoded()
        delta = full[self._emitted :]
        self._emitted = len(full)
        self.text = full
        return delta
