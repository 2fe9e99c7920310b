"""Prompt lookup: the tokens that followed the latest earlier occurrence of the context's last n-gram.

The context is the prompt and everything generated so far. For n from `max_ngram` down to 1, the
last n tokens are searched for earlier in the context (latest occurrence first, so a loop in the
generated text is followed before a distant match in the prompt); the first hit proposes the
tokens that followed it, at most `max_tokens`. transformers' `prompt_lookup_num_tokens` proposes the
same way but from the *earliest* occurrence, and searches the whole context every round; here an
index of where each n-gram last ended is extended by the tokens appended since the last call, so a
round costs O(new tokens).
"""

from __future__ import annotations


class PromptLookup:
    """An n-gram index over one growing context (`extend` it, then ask `propose`)."""

    def __init__(self, max_ngram: int = 3) -> None:
        if max_ngram < 1:
            raise ValueError("prompt lookup needs n-grams of at least one token")
        self.max_ngram = max_ngram
        self.context: list[int] = []
        # n-gram -> end index (exclusive) of its latest occurrence *before* the context's last position
        self._latest: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_ngram)]
        self._indexed = 0  # n-grams ending at or before this index are in `_latest`

    def extend(self, tokens: list[int]) -> None:
        """Append `tokens` to the context."""
        self.context.extend(tokens)

    def _index_up_to(self, end: int) -> None:
        """Index every n-gram that ends at or before `end` (exclusive end positions `<= end`)."""
        for stop in range(self._indexed + 1, end + 1):
            for n in range(1, self.max_ngram + 1):
                if stop - n >= 0:
                    self._latest[n - 1][tuple(self.context[stop - n:stop])] = stop
        self._indexed = max(self._indexed, end)

    def propose(self, max_tokens: int) -> tuple[list[int], int]:
        """Return up to `max_tokens` tokens that followed the latest earlier match of the longest
        matching suffix n-gram, and that n (`[], 0`: no match, or `max_tokens` is 0)."""
        length = len(self.context)
        if max_tokens <= 0 or length < 2:
            return [], 0
        self._index_up_to(length - 1)  # matches must end before the suffix itself ends
        for n in range(min(self.max_ngram, length - 1), 0, -1):
            end = self._latest[n - 1].get(tuple(self.context[length - n:]))
            if end is not None:
                return self.context[end:end + max_tokens], n
        return [], 0
