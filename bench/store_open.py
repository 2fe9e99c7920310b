"""Benchmark what `eyas train` pays to check a feature store as it opens it, against reading the store.

`eyas.features.store.open_store` runs before a training run is claimed: per shard a cheap look (size,
safetensors header, `sample_ids` against the manifest, offsets: `shard_problems`) and then its sha256
(`sha256_file`), so that `train` refuses a swapped, foreign, truncated or altered shard as `eyas verify`
does; the checksums run on as many threads as there are cores (one shard each). The baseline is what
training does with the shards anyway: reading every sample once (`FeatureShard.sample`, dequantized to
float32 and checked finite), which each epoch repeats.

One store of `--shards` bf16 shards of random features (`--hidden` wide, 3 aux layers, `--tokens` tokens
per shard in samples of `--sample-tokens`) is written in a temporary directory, then `--repeat` rounds
time, shard by shard and in turn, the cheap look, the sha256 and the full read (the file is in the page
cache after the first touch: the figures are the CPU's, not the disk's), then the whole `open_store` and
the whole store read. Headlines: `open_store_vs_read`, the median over rounds of `open_store`'s seconds
over one read of every sample of the store, and `sha256_vs_read` per shard on one thread, each with its
quartiles and range (eyas.decode.paired); `cheap_check_ms` per shard.

    .venv/bin/python bench/store_open.py                       # 2 shards of 512 MiB, 5 rounds
    .venv/bin/python bench/store_open.py --hidden 4096 --tokens 16384
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from eyas.decode.paired import paired_speedup
from eyas.features.store import (FeatureShard, SampleFeatures, StoreManifest, open_store, shard_name, shard_problems,
                                 write_shard)
from eyas.files import sha256_file
from eyas.precision import machine_record

NUM_AUX = 3


def build_store(root: Path, shards: int, tokens: int, sample_tokens: int, hidden: int) -> StoreManifest:
    """Write `shards` shards of random bf16 features under `root`; return a manifest listing them (built
    without validation: only the fields `shard_problems` reads are real)."""
    generator = torch.Generator().manual_seed(0)
    infos, first = [], 0
    for index in range(shards):
        samples = [SampleFeatures(first + s, torch.randint(0, 32000, (sample_tokens,), generator=generator),
                                  torch.ones(sample_tokens, dtype=torch.bool),
                                  torch.randn(sample_tokens, NUM_AUX * hidden, generator=generator),
                                  torch.randn(sample_tokens, hidden, generator=generator))
                   for s in range(tokens // sample_tokens)]
        infos.append(write_shard(root / shard_name(index), index, samples, "bf16", NUM_AUX))
        first += len(samples)
    return StoreManifest.model_construct(layer_ids=list(range(NUM_AUX)), hidden_size=hidden, storage_dtype="bf16",
                                         shards=infos, samples=first, tokens=shards * tokens)


def timed(work) -> float:  # noqa: ANN001 - any callable
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def read_every_sample(path: Path) -> None:
    shard = FeatureShard(path)
    for position in range(len(shard)):
        shard.sample(position)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32768, help="tokens per shard")
    parser.add_argument("--sample-tokens", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        manifest = build_store(root, args.shards, args.tokens, args.sample_tokens, args.hidden)
        cheap, hashed, read, opened, read_store = [], [], [], [], []
        for _ in range(args.repeat):
            for info in manifest.shards:
                path = root / info.file
                cheap.append(timed(lambda: shard_problems(root, info, manifest)))
                hashed.append(timed(lambda: sha256_file(path)))
                read.append(timed(lambda: read_every_sample(path)))
            opened.append(timed(lambda: open_store(root, manifest)))
            read_store.append(timed(lambda: [read_every_sample(root / info.file) for info in manifest.shards]))
        mib = statistics.median(info.bytes for info in manifest.shards) / 2**20
        # paired_speedup(baseline, candidate) is the baseline's seconds over the candidate's per pair: with the
        # sha256 as the baseline and the read as the candidate, the sha256's seconds over the read's
        share = paired_speedup([(1.0, s) for s in hashed], [(1.0, s) for s in read], unit="shard reads")
        whole = paired_speedup([(1.0, s) for s in opened], [(1.0, s) for s in read_store], unit="rounds")
        print(json.dumps({
            "bench": "store_open", "shards": args.shards, "shard_mib": round(mib, 1), "tokens_per_shard": args.tokens,
            "hidden": args.hidden, "repeat": args.repeat, **machine_record(),
            "cheap_check_ms": round(1000 * statistics.median(cheap), 3),
            "sha256_s": round(statistics.median(hashed), 4), "sha256_gib_per_s": round(mib / 1024 / statistics.median(hashed), 2),
            "read_all_samples_s": round(statistics.median(read), 4),
            "open_store_s": round(statistics.median(opened), 4), "read_store_s": round(statistics.median(read_store), 4),
            **whole.fields("open_store_vs_read"), **share.fields("sha256_vs_read"),
        }))


if __name__ == "__main__":
    main()
