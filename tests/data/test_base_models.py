"""Base models (no chat template): `eyas regenerate` continues raw text into documents `eyas prepare` trains
on, as transformers' greedy `generate` continues it; a `--chat-template FILE` makes every chat verb work on a
template-less target, the fingerprint following the file (later stages accept the same file and name the
template when it differs); `--stop-ids`/`--stop-tokens` stop generation where `generate` with the same
`eos_token_id` list stops."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import chat, write_jsonl

from eyas.config import ExtractConfig, PrepareConfig, TrainConfig
from eyas.data.prepare import run_prepare
from eyas.decode.prompts import read_prompts
from eyas.draft.config import draft_config_for_target
from eyas.draft.model import Eagle3Draft, save_draft
from eyas.errors import EyasError
from eyas.features.extract import run_extract
from eyas.features.preflight import preflight_extract
from eyas.files import sha256_text
from eyas.models.fingerprint import target_fingerprint
from eyas.models.load import load_config
from eyas.models.tokenizer import load_tokenizer
from eyas.testing.tiny import build_tiny_target
from eyas.train.setup import resolve_train

CHATML = ("{%- for message in messages %}"
          "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
          "{%- endfor %}"
          "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
TEXTS = ["The quick brown fox", "def add(a, b):", "Hello! How can I help you today? Sure, here is a list",
         "A hawk taken young"]
NEW = 12


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny fp32 target with weights and no chat template, its greedy oracle, and a ChatML template file."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("base-model")
    target = build_tiny_target(root / "target", "chatml", with_template=False, with_weights=True)
    template = root / "chatml.jinja"
    template.write_text(CHATML, encoding="utf-8")
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    return {"target": target, "template": template, "model": model, "tokenizer": load_tokenizer(target)}


def oracle(base: dict[str, Any], ids: list[int], new: int = NEW, extra_eos: tuple[int, ...] = ()) -> list[int]:
    """Return transformers' greedy new tokens after `ids`, stopping at the target's EOS and `extra_eos`."""
    tokenizer = base["tokenizer"]
    row = torch.tensor([ids])
    with torch.inference_mode():
        out = base["model"].generate(row, attention_mask=torch.ones_like(row), max_new_tokens=new, do_sample=False,
                                     eos_token_id=[tokenizer.eos_token_id, *extra_eos],
                                     pad_token_id=tokenizer.pad_token_id)
    return out[0, len(ids):].tolist()


def regenerate(target: Path, prompts: Path, out: Path, *extra: str | Path) -> list[str | Path]:
    return ["regenerate", "--target", target, "--prompts", prompts, "--out", out, "--max-new-tokens", str(NEW),
            "--temperature", "0", "--token-budget", "64", "--device", "cpu", "--dtype", "float32", *extra]


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_raw_text_is_continued_as_greedy_generate_does_and_prepare_trains_it(base, run_cli, tmp_path: Path) -> None:
    tokenizer = base["tokenizer"]
    records = [{"prompt": TEXTS[0]}, {"text": TEXTS[1]}, {"prompt": TEXTS[2]}, {"text": TEXTS[3]}]
    prompts = write_jsonl(tmp_path / "prompts.jsonl", records)
    result = run_cli(*regenerate(base["target"], prompts, tmp_path / "regen"))  # auto: no template, so text
    assert result.code == 0, result.err
    assert "4 prompts continued (raw text)" in result.out and not (tmp_path / "regen" / "conversations.jsonl").exists()
    documents = lines(tmp_path / "regen" / "documents.jsonl")
    assert [d["source"] for d in documents] == [f"{prompts}:{i}" for i in range(1, 5)]
    for text, document in zip(TEXTS, documents):  # left-padded batches of 2, 1 and 1 rows (budget 64)
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text  # so the whole decoded sequence is prompt + continuation
        new = oracle(base, ids)
        stopped = tokenizer.eos_token_id in new
        kept = new[:new.index(tokenizer.eos_token_id)] if stopped else new
        assert document["text"] == tokenizer.decode(ids + kept, skip_special_tokens=True)
        assert document["text"].startswith(text) and len(document["text"]) > len(text)
        assert document["finish"] == ("eos" if stopped else "length")

    manifest, _ = run_prepare(PrepareConfig(target=base["target"], data=[tmp_path / "regen" / "documents.jsonl"],
                                            out=tmp_path / "ds"))
    assert manifest.counts["rows"] == 4 and manifest.counts["prompts"] == 0
    assert manifest.counts["loss_tokens"] == manifest.counts["tokens"]  # documents are trained on in full


def test_the_refusals_name_the_way_out(base, run_cli, tmp_path: Path) -> None:
    chats = write_jsonl(tmp_path / "chats.jsonl", [chat(("user", "hi"))])
    refused = run_cli(*regenerate(base["target"], chats, tmp_path / "a", "--mode", "chat"))
    assert refused.code == 2 and refused.err.count("\n") == 1
    assert "has no chat template; give one with --chat-template FILE, or continue raw text with --mode text" in refused.err
    as_text = run_cli(*regenerate(base["target"], chats, tmp_path / "b"))
    assert as_text.code == 2 and as_text.err.count("\n") == 1
    assert f"{chats}:1: messages: a chat, and this run continues raw text" in as_text.err
    assert "--chat-template FILE" in as_text.err
    conversations = write_jsonl(tmp_path / "conversations.jsonl", [chat(("user", "hi"), ("assistant", "hello"))])
    prepared = run_cli("prepare", "--target", base["target"], "--data", conversations, "--out", tmp_path / "ds")
    assert prepared.code == 2 and "no chat template; conversation records need one (give one with --chat-template FILE)" \
        in prepared.err


def test_a_chat_template_file_serves_every_chat_verb_and_the_fingerprint_follows_it(base, run_cli, tmp_path: Path) -> None:
    target, template, tokenizer = base["target"], base["template"], base["tokenizer"]
    as_json = tmp_path / "chat_template.json"
    as_json.write_text(json.dumps({"chat_template": CHATML}), encoding="utf-8")
    with_file = load_tokenizer(target, chat_template=template)
    assert with_file.chat_template == CHATML == load_tokenizer(target, chat_template=as_json).chat_template
    plain, templated = target_fingerprint(target, tokenizer), target_fingerprint(target, with_file)
    assert templated.chat_template == sha256_text(CHATML) != plain.chat_template and templated.id != plain.id

    # prepare: conversations rendered with the file, the assistant turn alone trained on
    data = write_jsonl(tmp_path / "conversations.jsonl", [chat(("user", "Write a poem"), ("assistant", "The sea"))] * 3)
    prepared = run_cli("prepare", "--target", target, "--data", data, "--out", tmp_path / "ds", "--chat-template", template)
    assert prepared.code == 0, prepared.err
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert manifest["target"]["chat_template"] == sha256_text(CHATML)
    assert manifest["counts"]["rows"] == 3 and 0 < manifest["counts"]["loss_tokens"] < manifest["counts"]["tokens"]

    # regenerate and eval render a prompt as transformers renders it with the template given explicitly
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Write a poem"}])
    expected = tokenizer.apply_chat_template([{"role": "user", "content": "Write a poem"}], chat_template=CHATML,
                                             add_generation_prompt=True, tokenize=False)
    assert read_prompts(prompts, with_file) == [tokenizer(expected, add_special_tokens=False)["input_ids"]]
    answered = run_cli(*regenerate(target, prompts, tmp_path / "regen", "--chat-template", as_json))
    assert answered.code == 0, answered.err
    assert "1 prompts answered" in answered.out
    [conversation] = lines(tmp_path / "regen" / "conversations.jsonl")
    assert conversation["messages"][0] == {"role": "user", "content": "Write a poem"}
    assert conversation["messages"][1]["role"] == "assistant"

    # extract and train accept the dataset given the same file, and name both templates otherwise
    extract = ExtractConfig(target=target, data=tmp_path / "ds", out=tmp_path / "store", device="cpu")
    assert preflight_extract(extract.model_copy(update={"chat_template": template}), checks=False).problems == []
    [problem] = preflight_extract(extract, checks=False).problems
    assert problem == (f"{tmp_path / 'ds' / 'manifest.json'}: target: the dataset was made with another chat template "
                       f"(--chat-template {template}) than this run's (the target's own chat template); give the "
                       "--chat-template FILE it was made with")
    train = TrainConfig(target=target, data=tmp_path / "ds", out=tmp_path / "run", device="cpu")
    assert resolve_train(train.model_copy(update={"chat_template": template})).draft_config.target == templated
    with pytest.raises(EyasError, match="the dataset was made with another chat template"):
        resolve_train(train)
    run_extract(extract.model_copy(update={"chat_template": template, "dtype": "float32", "preflight": False}))
    offline = TrainConfig(features=tmp_path / "store", out=tmp_path / "run", device="cpu")
    assert resolve_train(offline.model_copy(update={"chat_template": template})).store.target == templated
    with pytest.raises(EyasError, match=r"\(fingerprints differ\); the store was made with another chat template "
                                        r"\(--chat-template .*chatml\.jinja\) than this run's"):
        resolve_train(offline)


def test_eval_takes_the_template_file_and_names_it_when_a_draft_needs_it(base, run_cli, tmp_path: Path) -> None:
    target, template = base["target"], base["template"]
    fingerprint = target_fingerprint(target, load_tokenizer(target, chat_template=template))
    draft_config = draft_config_for_target(load_config(target), [1, 3, 5], 64, fingerprint)
    torch.manual_seed(0)
    draft = Eagle3Draft(draft_config)
    draft.t2d[:64] = True  # the identity mapping of the first 64 ids
    save_draft(draft, tmp_path / "draft")
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [chat(("user", "Write a poem")), {"prompt": "Hello!"}])
    args = ["eval", "--target", target, "--draft", tmp_path / "draft", "--prompts", prompts, "--chain", "2",
            "--max-new-tokens", "6", "--device", "cpu", "--dtype", "float32"]
    refused = run_cli(*args, "--out", tmp_path / "a")
    assert refused.code == 2 and refused.err.count("\n") == 1
    assert "(chat_template differ); the draft was made with another chat template than this run's (the target's own " \
           "chat template); give the --chat-template FILE it was made with" in refused.err
    done = run_cli(*args, "--out", tmp_path / "b", "--chat-template", template)
    assert done.code == 0, done.err
    assert json.loads((tmp_path / "b" / "report.json").read_text())["same_as_baseline"] == 2
    # the verbs that check a draft against its target take the same file
    exported = tmp_path / "vllm"
    assert run_cli("export", "--draft", tmp_path / "draft", "--format", "vllm", "--out", exported).code == 0
    check = ["check-draft", exported, "--target", target, "--engine", "vllm"]
    assert "chat_template differ" in run_cli(*check).out + run_cli(*check).err
    assert run_cli(*check, "--chat-template", template).code == 0
    imported = run_cli("import", exported, "--target", target, "--out", tmp_path / "back", "--chat-template", template)
    assert imported.code == 0, imported.err
    embedded = run_cli("export", "--draft", tmp_path / "draft", "--format", "vllm", "--out", tmp_path / "embedded",
                       "--target", target, "--with-embedding", "--chat-template", template)
    assert embedded.code == 0, embedded.err


def first_repeat_free(tokens: list[int], tokenizer: Any, start: int = 3) -> int:
    """Return the first position from `start` whose token occurs nowhere before it and is spelled without
    a comma or a space (so `--stop-tokens` can name it)."""
    for position in range(start, len(tokens)):
        token = tokens[position]
        spelled = tokenizer.convert_ids_to_tokens(token)
        if token not in tokens[:position] and token != tokenizer.eos_token_id and "," not in spelled \
                and spelled == spelled.strip():
            return position
    raise AssertionError("no usable stop token in the greedy continuation")


def test_stop_ids_and_tokens_stop_where_generate_stops(base, run_cli, tmp_path: Path) -> None:
    tokenizer = base["tokenizer"]
    ids = tokenizer(TEXTS[0])["input_ids"]
    free = oracle(base, ids, 16)
    position = first_repeat_free(free, tokenizer)
    stop = free[position]
    expected = oracle(base, ids, 16, (stop,))
    assert expected == free[:position + 1]  # generate stops on the extra id, and emits it

    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": TEXTS[0]}])
    by_id = run_cli(*regenerate(base["target"], prompts, tmp_path / "ids", "--max-new-tokens", "16",
                                "--stop-ids", str(stop)))
    assert by_id.code == 0, by_id.err
    [document] = lines(tmp_path / "ids" / "documents.jsonl")
    assert document["finish"] == "eos"
    assert document["text"] == tokenizer.decode(ids + expected[:-1], skip_special_tokens=True)
    by_token = run_cli(*regenerate(base["target"], prompts, tmp_path / "tokens", "--max-new-tokens", "16",
                                   "--stop-tokens", tokenizer.convert_ids_to_tokens(stop)))
    assert by_token.code == 0, by_token.err
    assert lines(tmp_path / "tokens" / "documents.jsonl") == [document]

    fingerprint = target_fingerprint(base["target"], tokenizer)
    save_draft(Eagle3Draft(draft_config_for_target(load_config(base["target"]), [1, 3, 5], 64, fingerprint)),
               tmp_path / "draft")
    evaluated = run_cli("eval", "--target", base["target"], "--draft", tmp_path / "draft", "--prompts", prompts,
                        "--out", tmp_path / "eval", "--chain", "3", "--max-new-tokens", "16", "--device", "cpu",
                        "--dtype", "float32", "--stop-ids", str(stop))
    assert evaluated.code == 0, evaluated.err
    [line] = lines(tmp_path / "eval" / "results.jsonl")
    assert line["baseline_new_tokens"] == line["new_tokens"] == len(expected) and line["same_tokens"]


@pytest.mark.parametrize(("flags", "message"), [
    (("--stop-ids", "1,100000"), "stop_ids: 100000 is outside the vocabulary of"),
    (("--stop-tokens", "<no-such-token>"), "stop_tokens: '<no-such-token>' is not one token of the tokenizer of"),
])
def test_unknown_stops_are_one_line(base, run_cli, tmp_path: Path, flags: tuple[str, str], message: str) -> None:
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": TEXTS[0]}])
    refused = run_cli(*regenerate(base["target"], prompts, tmp_path / "regen", *flags))
    assert refused.code == 2 and refused.err.count("\n") == 1 and message in refused.err
    assert not (tmp_path / "regen").exists()  # refused before the output was claimed


@pytest.mark.parametrize(("name", "text", "message"), [
    ("broken.jinja", "{% for m in messages %}{{ m.content }\n{% endfor %}", "broken.jinja:1: not a Jinja chat template: "),
    ("filter.jinja", "{{ messages | nosuchfilter }}", "filter.jinja:1: not a Jinja chat template: No filter named"),
    ("empty.jinja", "  \n", "empty.jinja: empty chat template"),
    ("shape.json", '{"template": "x"}', "shape.json: chat_template: expected a string"),
    ("missing.jinja", None, "missing.jinja: chat template file not found"),
])
def test_a_bad_template_file_is_one_line_naming_it(base, run_cli, tmp_path: Path, name: str, text: str | None,
                                                   message: str) -> None:
    if text is not None:
        (tmp_path / name).write_text(text, encoding="utf-8")
    data = write_jsonl(tmp_path / "conversations.jsonl", [chat(("user", "hi"), ("assistant", "hello"))])
    refused = run_cli("prepare", "--target", base["target"], "--data", data, "--out", tmp_path / "ds",
                      "--chat-template", tmp_path / name)
    assert refused.code == 2 and refused.err.count("\n") == 1, refused.err
    assert f"{tmp_path / name}" in refused.err and message in refused.err
