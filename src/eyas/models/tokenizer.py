"""Load a target's tokenizer from a local model directory or GGUF file, offline, with the chat template
in effect: the target's own, or the one a `--chat-template FILE` gives (every verb applies it here, so
the target fingerprint, which hashes `tokenizer.chat_template`, follows the template actually used)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eyas.errors import EyasError
from eyas.files import parse_json_object, reading
from eyas.models.fingerprint import TargetFingerprint, config_source, config_vocab_size, hf_location, read_model_config

_PROBE = [{"role": "user", "content": "eyasprobe"}]


def load_tokenizer(target: Path, trust_remote_code: bool = False, chat_template: Path | None = None) -> Any:
    """Return the fast tokenizer of a model directory or GGUF file `target` (never downloads), its chat
    template replaced by the file `chat_template` when one is given (`read_chat_template`).

    Refuses a directory without config.json, a tokenizer that fails to load, a tokenizer with more
    tokens than the model's vocabulary, and a template file `read_chat_template` refuses.
    """
    template = read_chat_template(chat_template) if chat_template is not None else None
    vocab_size = config_vocab_size(target, read_model_config(target))
    from transformers import AutoTokenizer

    path, kwargs = hf_location(target)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code, **kwargs)
    except Exception as exc:  # transformers raises many types here (OSError, ValueError, ...)
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EyasError(f"{target}: cannot load the tokenizer: {first_line}") from None
    if len(tokenizer) > vocab_size:
        raise EyasError(
            f"{config_source(target)}: vocab_size: {vocab_size} is smaller than the tokenizer's {len(tokenizer)} tokens"
        )
    if template is not None:
        tokenizer.chat_template = template
        _check_renders(tokenizer, chat_template)  # type: ignore[arg-type]
    return tokenizer


def read_chat_template(path: Path) -> str:
    """Return the Jinja source of the chat template file `path`: a `.json` file in the shape of Hugging
    Face's `chat_template.json` (`{"chat_template": "..."}`), any other file the template itself.

    Refuses, in one line naming the file, a missing or unreadable file, malformed JSON or a JSON file
    without a `chat_template` string, and an empty template.
    """
    if not path.is_file():
        raise EyasError(f"{path}: chat template file not found (--chat-template)")
    with reading(path):
        text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        template = parse_json_object(text, str(path), numbered=True).get("chat_template")
        if not isinstance(template, str):
            raise EyasError(f"{path}: chat_template: expected a string (the shape of Hugging Face's chat_template.json)")
        text = template
    if not text.strip():
        raise EyasError(f"{path}: empty chat template (--chat-template)")
    return text


def _check_renders(tokenizer: Any, path: Path) -> None:
    """Refuse, naming `path` (and the line of a syntax error), a template that cannot render one user
    message with the generation prompt: not Jinja, an unknown filter, or a failure on the plainest prompt."""
    import jinja2

    try:
        tokenizer.apply_chat_template(_PROBE, tokenize=False, add_generation_prompt=True)
    except jinja2.TemplateSyntaxError as exc:
        raise EyasError(f"{path}:{exc.lineno}: not a Jinja chat template: {exc.message}") from None
    except Exception as exc:  # a template is arbitrary Jinja: any failure on one user message makes it unusable
        raise EyasError(f"{path}: the chat template fails on one user message: {exc}") from None


def template_in_use(chat_template: Path | None) -> str:
    """Return how a run names the chat template it uses: `--chat-template FILE`, or the target's own."""
    return f"--chat-template {chat_template}" if chat_template is not None else "the target's own chat template"


def template_mismatch(what: str, made_for: TargetFingerprint, this: TargetFingerprint, chat_template: Path | None,
                      made_with: str | None = None) -> str | None:
    """Return, when `made_for` (the target an artifact records) and `this` (this run's target) differ in
    their chat template but not their tokenizer, the line that says `what` (e.g. "the dataset") was made
    with another one, naming both (`made_with`: how the artifact's was given, where known) and the way
    out; else None."""
    same_tokens = (made_for.tokenizer, made_for.vocab_size) == (this.tokenizer, this.vocab_size)
    if made_for.chat_template == this.chat_template or not same_tokens:
        return None
    other = f" ({made_with})" if made_with else ""
    return (f"{what} was made with another chat template{other} than this run's ({template_in_use(chat_template)}); "
            "give the --chat-template FILE it was made with")
