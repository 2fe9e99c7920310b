"""Draft vocabulary: d2t/t2d mapping, deterministic ties, cache keyed by dataset fingerprint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from eyas.data.vocab import cached_draft_vocab, load_draft_vocab, save_draft_vocab, select_draft_vocab
from eyas.errors import EyasError


def test_d2t_offsets_map_draft_ids_to_the_selected_target_ids() -> None:
    counts = np.array([0, 50, 3, 0, 7, 7, 100, 1, 0, 9], dtype=np.int64)
    vocab = select_draft_vocab(counts, 4)
    selected = [1, 4, 6, 9]  # 100, 50, 9, then 7 at id 4 beats 7 at id 5
    assert [i + int(vocab.d2t[i]) for i in range(4)] == selected
    assert vocab.token_ids.tolist() == selected
    assert vocab.d2t.dtype == np.int64 and vocab.t2d.dtype == bool
    assert int(vocab.t2d.sum()) == 4 and np.flatnonzero(vocab.t2d).tolist() == selected
    assert vocab.coverage == pytest.approx((50 + 7 + 100 + 9) / counts.sum())


def test_ties_are_broken_by_lower_id_whatever_the_input_order() -> None:
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 4, size=1000)  # many ties
    first = select_draft_vocab(counts, 100)
    expected = sorted(sorted(range(1000), key=lambda i: (-counts[i], i))[:100])
    assert first.token_ids.tolist() == expected
    assert select_draft_vocab(counts.copy(), 100).d2t.tolist() == first.d2t.tolist()


def test_unseen_ids_fill_the_vocab_in_id_order() -> None:
    vocab = select_draft_vocab(np.array([0, 0, 5, 0, 0]), 3)
    assert vocab.token_ids.tolist() == [0, 1, 2]
    assert vocab.coverage == 1.0


@pytest.mark.parametrize("size", [0, 6])
def test_size_outside_the_target_vocab_is_refused(size: int) -> None:
    with pytest.raises(EyasError, match="draft_vocab_size"):
        select_draft_vocab(np.ones(5, dtype=np.int64), size)


def test_saved_vocab_round_trips_and_refuses_another_dataset(tmp_path: Path) -> None:
    vocab = select_draft_vocab(np.arange(20), 5)
    save_draft_vocab(tmp_path / "v.safetensors", vocab, "fp-a")
    loaded = load_draft_vocab(tmp_path / "v.safetensors", "fp-a")
    assert loaded.d2t.tolist() == vocab.d2t.tolist() and loaded.t2d.tolist() == vocab.t2d.tolist()
    with pytest.raises(EyasError, match="made for another dataset"):
        load_draft_vocab(tmp_path / "v.safetensors", "fp-b")


def test_cache_hits_for_the_same_dataset_and_is_never_reused_for_another(tmp_path: Path) -> None:
    counts_a = np.array([5, 4, 3, 2, 1, 0])
    counts_b = counts_a[::-1].copy()
    vocab_a, cached = cached_draft_vocab(tmp_path, "a" * 64, counts_a, 2)
    assert not cached and vocab_a.token_ids.tolist() == [0, 1]
    assert cached_draft_vocab(tmp_path, "a" * 64, counts_a, 2)[1]
    # same 16-char prefix, different dataset: the full fingerprint is compared, so no reuse
    vocab_b, cached = cached_draft_vocab(tmp_path, "a" * 16 + "b" * 48, counts_b, 2)
    assert not cached and vocab_b.token_ids.tolist() == [4, 5]
    assert not cached_draft_vocab(tmp_path, "a" * 64, counts_a, 3)[1]
