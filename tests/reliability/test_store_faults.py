"""A feature store or dataset that is damaged, mixed with another, or empty is refused in one line naming the
file and what differs (exit 2; extract's preflight: exit 1), before anything is claimed or a weight loads:
`eyas train` checks each shard against the manifest as it opens the store (size, header, sample ids,
offsets, then its sha256 once per run), so it refuses what `eyas verify` reports; truncated or missing
shards, Parquet files and vocabularies are named, never a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import tree_bytes
from safetensors import safe_open
from safetensors.torch import save_file

from eyas.config import ExtractConfig, PrepareConfig
from eyas.data.prepare import run_prepare
from eyas.errors import EyasError
from eyas.features.extract import run_extract
from eyas.features.store import FeatureShard, open_store, read_store_manifest, shard_name

pytestmark = pytest.mark.usefixtures("one_thread")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data"
TRAIN = ("--device", "cpu", "--max-steps", "1", "dtype=float32", "target_dtype=float32")


def damaged(store: Path) -> str:
    """Return the advice that ends every refusal of a damaged store."""
    return (f"the store is damaged or mixed with another: `eyas verify {store}` lists every problem; extract it again "
            "(eyas extract --overwrite)")


def extract(target: Path, data: Path, out: Path, **extra: object) -> Path:
    run_extract(ExtractConfig(target=target, data=data, out=out, dtype="float32", storage_dtype="fp32", device="cpu",
                              shard_tokens=256, preflight=False, **extra))
    return out


@pytest.fixture(scope="module")
def stores(example_store: Path, weighted_target, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`store`: the example dataset in shards of about 256 tokens; `other`: the same dataset and shards with
    other aux layers (the same sizes and sample ids, other features); `data`: that dataset (with a vocabulary)."""
    root = tmp_path_factory.mktemp("sharded")
    target, data = weighted_target("llama"), example_store.parent / "ds"
    store = extract(target, data, root / "store")
    other = extract(target, data, root / "other", layers=[1, 2, 3], layer_convention="input")
    assert len(read_store_manifest(store).shards) >= 3
    return {"store": store, "other": other, "data": data, "target": target}


def copy_store(stores: dict[str, Path], root: Path) -> Path:
    store = root / "store"
    shutil.copytree(stores["store"], store)
    return store


def rewrite_shard(path: Path, change: str) -> None:
    """Rewrite the shard `path` with `change` made to it, keeping its size: an `offsets` entry moved by one
    token (still ascending), one changed token id (`input_ids`), every sample id one higher (`sample_ids`),
    or an offset past the next one (`descending-offsets`)."""
    with safe_open(str(path), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        metadata = handle.metadata()
    if change == "offsets":
        tensors["offsets"][1] += 1
    elif change == "input_ids":
        tensors["input_ids"][3] = (tensors["input_ids"][3] + 1) % 64
    elif change == "sample_ids":
        tensors["sample_ids"] += 1
    else:
        tensors["offsets"][1] = tensors["offsets"][2] + 1
    size = path.stat().st_size
    save_file(tensors, str(path), metadata=metadata)
    assert path.stat().st_size == size


def refused(run_cli, *args: str | Path) -> str:
    """Return the one-line error of a command that must exit 2 without a traceback."""
    result = run_cli(*args)
    assert result.code == 2, (result.code, result.out, result.err)
    assert result.err.count("\n") == 1 and result.err.startswith("eyas: error: ") and "Traceback" not in result.err
    return result.err.removeprefix("eyas: error: ").removesuffix("\n")


def test_an_intact_sharded_store_opens_and_verifies(stores, run_cli) -> None:
    manifest = read_store_manifest(stores["store"])
    shards = open_store(stores["store"], manifest)
    assert [int(shard.sample_ids[0]) for shard in shards] == [info.first_sample for info in manifest.shards]
    assert run_cli("verify", stores["store"]).code == 0


@pytest.mark.parametrize("fault", ["swapped-shards", "shard-of-another-store", "changed-offsets", "changed-token-id"])
def test_train_refuses_a_corrupted_store_that_verify_reports(fault: str, stores, run_cli, tmp_path: Path) -> None:
    """The probe's corruptions (F4): each refused by train, before the run directory is made, with the
    problem `eyas verify` lists for that shard; the store is left as it was."""
    store = copy_store(stores, tmp_path)
    manifest = read_store_manifest(store)
    first, second = (store / info.file for info in manifest.shards[:2])
    if fault == "swapped-shards":
        first.rename(tmp_path / "first")
        second.rename(first)
        (tmp_path / "first").rename(second)
        sizes = (manifest.shards[1].bytes, manifest.shards[0].bytes)
        assert sizes[0] != sizes[1]
        problem = (f"{first}: {sizes[0]} bytes but the manifest lists {sizes[1]} (truncated, or another shard: "
                   "swapped, or from another store)")
    elif fault == "shard-of-another-store":
        shutil.copy(stores["other"] / second.name, second)  # same size and sample ids: only its bytes differ
        problem = f"{second}: sha256 mismatch (file changed or corrupted)"
    else:
        rewrite_shard(second, {"changed-offsets": "offsets", "changed-token-id": "input_ids"}[fault])
        problem = f"{second}: sha256 mismatch (file changed or corrupted)"
    before = tree_bytes(store)
    out = tmp_path / "run"
    assert refused(run_cli, "train", "--features", store, "--out", out, *TRAIN) == f"{problem}; {damaged(store)}"
    assert not out.exists()
    assert tree_bytes(store) == before
    verified = run_cli("verify", store)
    assert verified.code == 1 and f"eyas verify: {problem}\n" in verified.err


@pytest.mark.parametrize("change", ["sample_ids", "descending-offsets"])
def test_a_changed_sample_id_or_broken_offsets_are_named_before_the_checksum(change: str, stores, run_cli,
                                                                             tmp_path: Path) -> None:
    """What the cheap look finds is named as such (the sha256 differs too, but says less)."""
    store = copy_store(stores, tmp_path)
    info = read_store_manifest(store).shards[1]
    shard = store / info.file
    rewrite_shard(shard, change)
    last = info.first_sample + info.samples - 1
    problem = (f"{shard}: sample_ids: samples {info.first_sample + 1}..{last + 1} but the manifest lists "
               f"{info.first_sample}..{last} for {info.file} (shards swapped, or one of another store)"
               if change == "sample_ids" else f"{shard}: offsets: do not run from 0 up to its {info.tokens} tokens")
    out = tmp_path / "run"
    assert refused(run_cli, "train", "--features", store, "--out", out, *TRAIN) == f"{problem}; {damaged(store)}"
    assert not out.exists()


@pytest.mark.parametrize("fault", ["truncated", "missing"])
def test_a_truncated_or_missing_store_shard_is_named(fault: str, stores, run_cli, tmp_path: Path) -> None:
    store = copy_store(stores, tmp_path)
    info = read_store_manifest(store).shards[1]
    shard = store / info.file
    if fault == "truncated":
        with open(shard, "r+b") as handle:
            handle.truncate(1000)
        problem = (f"{shard}: 1000 bytes but the manifest lists {info.bytes} (truncated, or another shard: swapped, or "
                   "from another store)")
    else:
        shard.unlink()
        problem = f"{shard}: missing (listed in {store / 'manifest.json'})"
    out = tmp_path / "run"
    assert refused(run_cli, "train", "--features", store, "--out", out, *TRAIN) == f"{problem}; {damaged(store)}"
    assert not out.exists()
    verified = run_cli("verify", store)
    assert verified.code == 1 and f"eyas verify: {problem}\n" in verified.err and "Traceback" not in verified.err


def test_a_shard_that_is_no_safetensors_file_is_named_when_opened(tmp_path: Path) -> None:
    path = tmp_path / shard_name(0)
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(EyasError) as error:
        FeatureShard(path)
    message = str(error.value)
    assert message.startswith(f"{path}: cannot read it: not a readable safetensors file (") and "\n" not in message


def test_a_truncated_dataset_shard_is_named_by_extract(stores, run_cli, tmp_path: Path) -> None:
    data = tmp_path / "ds"
    shutil.copytree(stores["data"], data)
    parquet = data / "data-00000.parquet"
    with open(parquet, "r+b") as handle:
        handle.truncate(1000)
    out = tmp_path / "store"
    err = refused(run_cli, "extract", "--target", stores["target"], "--data", data, "--out", out, "--device", "cpu",
                  "--dtype", "float32", "--no-preflight")
    assert err.startswith(f"{parquet}: cannot read it: not a readable Parquet file (Parquet magic bytes not found")
    assert not out.exists()


def test_a_missing_vocabulary_is_named_by_train(stores, run_cli, tmp_path: Path) -> None:
    data = tmp_path / "ds"
    shutil.copytree(stores["data"], data)
    (data / "vocab.safetensors").unlink()
    out = tmp_path / "run"
    err = refused(run_cli, "train", "--features", stores["store"], "--data", data, "--out", out, *TRAIN)
    assert err.startswith(f"{data / 'vocab.safetensors'}: cannot read it: No such file or directory")
    assert not out.exists()


def test_a_vocabulary_with_malformed_metadata_is_named_by_train(stores, run_cli, tmp_path: Path) -> None:
    data = tmp_path / "ds"
    shutil.copytree(stores["data"], data)
    vocab = data / "vocab.safetensors"
    with safe_open(str(vocab), framework="pt") as handle:
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    save_file(tensors, str(vocab), metadata={"eyas.draft_vocab": "{not json"})
    out = tmp_path / "run"
    err = refused(run_cli, "train", "--features", stores["store"], "--data", data, "--out", out, *TRAIN)
    assert err.startswith(f"{vocab}: metadata eyas.draft_vocab: malformed JSON: ")
    assert not out.exists()


@pytest.fixture(scope="module")
def prompts_only(weighted_target, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset prepared from prompts alone: no row to extract, its prompts for regenerate and eval."""
    out = tmp_path_factory.mktemp("prompts-only") / "ds"
    run_prepare(PrepareConfig(target=weighted_target("llama"), data=[EXAMPLES / "prompts.jsonl"], out=out))
    counts = json.loads((out / "manifest.json").read_text())["counts"]
    assert counts["rows"] == 0 and counts["prompts"] == 5
    return out


def no_samples(data: Path) -> str:
    return (f"{data}: holds no samples (no record carrying a loss token); its 5 record(s) are prompts only, for "
            f"`eyas regenerate` and `eyas eval`: have the target answer them (eyas regenerate --prompts {data} "
            "--target MODEL --out DIR), then prepare DIR/conversations.jsonl")


def test_extract_and_online_train_refuse_a_dataset_of_prompts_only(prompts_only: Path, weighted_target, run_cli,
                                                                   tmp_path: Path) -> None:
    """Refused before any weight loads (F14): by extract's preflight (exit 1; with --no-preflight too), by
    online train (exit 2). Nothing is written."""
    target = weighted_target("llama")
    for extra in ((), ("--no-preflight",)):
        out = tmp_path / f"store{len(extra)}"
        result = run_cli("extract", "--target", target, "--data", prompts_only, "--out", out, "--device", "cpu", *extra)
        assert result.code == 1 and "Traceback" not in result.err, (result.out, result.err)
        assert result.err == f"eyas: error: preflight found 1 problem(s): {no_samples(prompts_only)}\n"
        assert not out.exists()
    out = tmp_path / "run"
    assert refused(run_cli, "train", "--data", prompts_only, "--target", target, "--out", out, *TRAIN) == \
        no_samples(prompts_only)
    assert not out.exists()


def test_train_refuses_an_empty_store_in_one_line(example_store: Path, run_cli, tmp_path: Path) -> None:
    """A store of no samples, as an earlier eyas extracted from a prompts-only dataset (F14)."""
    store = tmp_path / "store"
    shutil.copytree(example_store, store)
    manifest = json.loads((store / "manifest.json").read_text())
    for info in manifest["shards"]:
        (store / info["file"]).unlink()
    manifest.update(samples=0, tokens=0, bytes=0, shards=[])
    (store / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "run"
    assert refused(run_cli, "train", "--features", store, "--out", out, *TRAIN) == (
        f"{store}: holds no samples (extracted from {manifest['dataset_path']}, a dataset without a record carrying a "
        "loss token); prepare conversations (prompts only: answer them with `eyas regenerate` first), extract them, "
        "then train")
    assert not out.exists()
