"""A feature-store shard says how its features are stored; one that does not is refused, never
read as some assumed dtype."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eyas.errors import EyasError
from eyas.features.store import FeatureShard, SampleFeatures, shard_name, write_shard


def write_one(root: Path) -> tuple[Path, SampleFeatures]:
    generator = torch.Generator().manual_seed(0)
    sample = SampleFeatures(7, torch.arange(5), torch.ones(5, dtype=torch.bool),
                            torch.randn(5, 3 * 4, generator=generator), torch.randn(5, 4, generator=generator))
    path = root / shard_name(0)
    write_shard(path, 0, [sample], "fp32", 3)
    return path, sample


def test_a_shard_reads_back_as_written(tmp_path: Path) -> None:
    path, sample = write_one(tmp_path)
    read = FeatureShard(path).sample(0)
    assert torch.equal(read["aux"], sample.aux) and torch.equal(read["last"], sample.last)


def test_a_shard_without_metadata_is_refused_naming_it(tmp_path: Path) -> None:
    path, _ = write_one(tmp_path)
    save_file(load_file(str(path)), str(path))  # the same tensors, no metadata
    with pytest.raises(EyasError) as error:
        FeatureShard(path)
    message = str(error.value)
    assert message.startswith(f"{path}: metadata: no eyas.features storage_dtype") and "\n" not in message
