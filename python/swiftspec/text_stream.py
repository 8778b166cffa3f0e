"""Incremental detokenization with stop strings, for streaming generation."""

from __future__ import annotations

from typing import Sequence

_REPLACEMENT = "\ufffd"


class TextStream:
    """Turns token ids, as they are committed, into final text pieces.

    Text is emitted only once it cannot change: a trailing incomplete UTF-8
    sequence (decoded as U+FFFD) and any suffix that could still grow into a
    stop string are held back. When a stop string appears, the text is cut
    before it and :attr:`stopped` becomes True. Special tokens are not shown.

    The result is defined on the whole decoded text ``full = tokenizer.decode(all ids,
    skip_special_tokens=True)`` after each :meth:`push`: stop strings are looked for in
    ``full`` in the order given, each cutting ``full`` at its first occurrence; without a
    stop, ``full`` less its trailing U+FFFD and then, stop string by stop string, its longest
    suffix that begins that stop string, is final. The work per push, though, does not grow
    with the output: the ids are detokenized incrementally
    (:class:`swiftspec.tokenizer.StreamDecoder`) and only the text that can still hold a new
    stop string (the last ``sum(len(stop))`` characters of the final text plus the text that
    is not final yet) is kept and searched.
    """

    def __init__(self, tokenizer, stop: Sequence[str] = ()):
        from swiftspec.tokenizer import StreamDecoder

        self._decoder = StreamDecoder(tokenizer, skip_special_tokens=True)
        self._stop = list(stop)
        # Characters of the decoder's final text kept behind its end: a stop string not found
        # yet may begin up to len(stop) - 1 of them back, and holding back the prefixes of the
        # stop strings reads up to sum(len(stop) - 1) back.
        self._keep = sum(len(s) for s in self._stop)
        self._final = 0  # characters of the decoder's final text (a prefix of the decoded text)
        self._base = 0  # offset in the decoded text of self._window[0]
        self._window = ""  # the decoder's final text from self._base on
        self._emitted = 0  # characters of the decoded text already handed out
        self._pieces: list[str] = []
        self.stopped = False

    @property
    def text(self) -> str:
        """All text handed out so far (cut before a stop string once :attr:`stopped`)."""
        if len(self._pieces) > 1:
            self._pieces[:] = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def push(self, ids: Sequence[int]) -> str:
        """Adds committed tokens (ints); returns the newly final text (may be "").
        Raises :class:`swiftspec.InvalidRequestError` for ids outside the model's vocabulary."""
        if self.stopped:
            return ""
        final_before = self._final
        new_final = self._decoder.push(list(ids))
        self._window += new_final
        self._final += len(new_final)
        base = self._base
        full = self._window + self._decoder.pending  # the decoded text from base on
        end = base + len(full)  # its length
        for s in self._stop:
            # The text up to final_before held no stop string at the last push, so an occurrence
            # ends past it; full.find over [lo, end) finds the first one. ("" occurs at once, at 0.)
            lo = max(base, final_before - max(len(s), 1) + 1)
            cut = full.find(s, lo - base, end - base)
            if cut != -1:
                self.stopped = True
                end = base + cut
        safe = end
        if not self.stopped:
            # The final text never ends in U+FFFD (StreamDecoder holds such text back), so
            # neither this nor the hold-back below reads before base.
            while safe > base and full[safe - base - 1] == _REPLACEMENT:
                safe -= 1
            for s in self._stop:  # hold back a suffix that is a prefix of a stop string
                for k in range(min(len(s) - 1, safe), 0, -1):
                    if full[safe - k - base : safe - base] == s[:k]:
                        safe -= k
                        break
        safe = max(safe, self._emitted)
        delta = full[self._emitted - base : safe - base]
        self._emitted = safe
        if delta:
            self._pieces.append(delta)
        # Keep what the next push may read: the last _keep characters of the final text, and
        # everything not handed out yet.
        start = max(base, min(self._emitted, self._final - self._keep))
        if start > base:
            self._window = self._window[start - base :]
            self._base = start
        return delta

    def finish(self) -> str:
        """Flushes held-back text at the end of generation (an incomplete UTF-8 sequence
        as U+FFFD); "" once :attr:`stopped`."""
        if self.stopped:
            return ""
        self._window += self._decoder.flush()
        self._final = self._base + len(self._window)
        delta = self._window[self._emitted - self._base :]
        self._emitted = self._final
        if delta:
            self._pieces.append(delta)
        return delta
