"""Tiny target model directories built from scratch: a trained byte-level BPE tokenizer, a chat
template in the style of a real model family, and a `config.json` (no weights, no downloads).

Styles: "chatml" (SmolLM2 / Qwen2.5 shape), "llama3", "qwen3" (thinking blocks kept only in the
turns after the last user message), "mistral" (`[INST]` turns, no generation prompt), "hermes" (Qwen3 /
Hermes tool calling: `tools` listed in the system turn, `<tool_call>` JSON in assistant turns, tool results
as `<tool_response>` blocks in a user turn, `reasoning_content` as a thinking block in the turns after the
last user message, and `{% generation %}` markers around what the assistant writes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

Style = Literal["chatml", "llama3", "qwen3", "mistral", "hermes"]
STYLES: tuple[Style, ...] = ("chatml", "llama3", "qwen3", "mistral", "hermes")

CORPUS = [
    "The quick brown fox jumps over the lazy dog while the river runs past the old mill.",
    "Speculative decoding lets a small draft model propose tokens that a large target verifies.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Write a short poem about the sea, the wind, and a ship that never comes home.",
    "A hawk taken young from the nest is called an eyas; falconers train it with patience.",
    "Explain why the sky is blue in two sentences, for a curious child of seven.",
    "import json\nwith open('data.json') as handle:\n    records = json.load(handle)",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000, and punctuation: ; : , . ! ? ( ) [ ] { } < > | / \\ - _ = + * & ^ % $ # @ ~ '",
    "Hello! How can I help you today? Sure, here is a list of ideas for your weekend.",
    "<think>\nThe user wants a summary, so I should keep it brief.\n</think>\n\nHere is the summary.",
]

_TEMPLATES: dict[Style, str] = {
    "chatml": (
        "{%- for message in messages %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    ),
    "llama3": (
        "{{- bos_token }}"
        "{%- for message in messages %}"
        "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
    ),
    "qwen3": (
        "{%- set ns = namespace(last_query=-1) %}"
        "{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}"
        "{%- for message in messages %}"
        "{%- if message.role == 'assistant' %}"
        "{%- set content = message.content %}{%- set reasoning = '' %}"
        "{%- if '</think>' in content %}"
        "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
        "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
        "{%- endif %}"
        "{%- if loop.index0 > ns.last_query %}"
        "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' }}"
        "{%- else %}"
        "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- else %}"
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
        "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
        "{%- endif %}"
    ),
    "mistral": (
        "{{- bos_token }}"
        "{%- for message in messages %}"
        "{%- if message['role'] == 'user' %}{{- '[INST] ' + message['content'] + ' [/INST]' }}"
        "{%- elif message['role'] == 'assistant' %}{{- message['content'] + eos_token }}"
        "{%- else %}{{- '[SYS] ' + message['content'] + ' [/SYS]' }}{%- endif %}"
        "{%- endfor %}"
    ),
    "hermes": (
        "{%- set ns = namespace(last_query=-1) %}"
        "{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}"
        "{%- if tools %}"
        "{{- '<|im_start|>system\\n' }}"
        "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
        "{{- '# Tools\\n\\nTo call a function, write <tool_call></tool_call> around {\"name\": ..., \"arguments\": ...}.\\n<tools>' }}"
        "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
        "{{- '\\n</tools><|im_end|>\\n' }}"
        "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- for message in messages %}"
        "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
        "{%- elif message.role == 'assistant' %}"
        "{{- '<|im_start|>assistant\\n' }}"
        "{%- generation %}"
        "{%- if loop.index0 > ns.last_query and message.reasoning_content is string %}"
        "{{- '<think>\\n' + message.reasoning_content.strip('\\n') + '\\n</think>\\n\\n' }}"
        "{%- endif %}"
        "{{- message.content }}"
        "{%- for call in message.tool_calls or [] %}"
        "{%- if call.function %}{%- set call = call.function %}{%- endif %}"
        "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
        "{{- '<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' }}"
        "{{- call.arguments if call.arguments is string else call.arguments | tojson }}"
        "{{- '}\\n</tool_call>' }}"
        "{%- endfor %}"
        "{{- '<|im_end|>' }}"
        "{%- endgeneration %}"
        "{{- '\\n' }}"
        "{%- elif message.role == 'tool' %}"
        "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
        "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
        "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
        "{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    ),
}

# (special tokens, bos, eos, pad, model_type) per style
_SPECIALS: dict[Style, tuple[list[str], str | None, str, str, str]] = {
    "chatml": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|im_end|>", "<|endoftext|>", "llama"),
    "llama3": (["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
               "<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>", "llama"),
    "qwen3": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|im_end|>", "<|endoftext|>", "qwen3"),
    "mistral": (["<unk>", "<s>", "</s>"], "<s>", "</s>", "<unk>", "mistral"),
    "hermes": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|im_end|>", "<|endoftext|>", "qwen3"),
}


# config overrides that make each architecture tiny (MLA + MoE for DeepSeek-V3, as Kimi-K2 uses, with the router its
# released config names: vLLM reads topk_method and scoring_func, transformers assumes them). Gemma-3 and
# GPT-OSS keep their own head_dim apart from hidden / heads (32: vLLM's CPU attention serves it) and a sliding
# window of 8 tokens, so a test's prompts pass the window: Gemma-3 five sliding layers to one full, scaled and
# tied embeddings; GPT-OSS sliding and full layers alternating, attention sinks, 4 experts (2 per token), YaRN.
ARCHITECTURES: dict[str, dict[str, object]] = {
    "llama": {}, "qwen3": {}, "mistral": {}, "qwen2": {},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "decoder_sparse_step": 1},
    "deepseek_v3": {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 32,
                    "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1, "q_lora_rank": 32, "kv_lora_rank": 16,
                    "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16, "num_key_value_heads": 4,
                    "rope_scaling": None, "topk_method": "noaux_tc", "scoring_func": "sigmoid"},
    "gemma2": {"head_dim": 16}, "phi3": {}, "gpt_neox": {},
    "gemma3_text": {"head_dim": 32, "query_pre_attn_scalar": 32, "sliding_window": 8, "sliding_window_pattern": 6,
                    "tie_word_embeddings": True},
    "gpt_oss": {"head_dim": 32, "sliding_window": 8, "num_local_experts": 4, "num_experts_per_tok": 2,
                "max_position_embeddings": 131072},
}


def build_tiny_target(out: Path, style: Style = "chatml", vocab_size: int = 512, with_template: bool = True,
                      architecture: str | None = None, with_weights: bool = False, num_layers: int = 8,
                      seed: int = 0, attention_heads: int = 4) -> Path:
    """Write a tiny model directory (tokenizer files + config.json, and random weights when asked) to `out`.

    Hidden size 64 over `attention_heads` heads (half as many KV heads): 4 gives head_dim 16; vLLM's CPU
    attention needs at least 32, so the real-engine tests build 2.

    The BPE is trained on a small built-in corpus with byte-level pre-tokenization, so any text
    tokenizes. `config.json` declares a vocabulary padded to a multiple of 64, as real models do.
    `architecture` is a transformers model_type from ARCHITECTURES (default: the style's own).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoConfig, PreTrainedTokenizerFast

    specials, bos, eos, pad, model_type = _SPECIALS[style]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=eos, pad_token=pad)
    tokenizer.add_special_tokens({"additional_special_tokens": [s for s in specials if s not in (bos, eos, pad)]})
    if with_template:
        tokenizer.chat_template = _TEMPLATES[style]
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out))
    padded_vocab = -(-len(tokenizer) // 64) * 64
    model_type = architecture or model_type
    sizes: dict[str, object] = {
        "vocab_size": padded_vocab, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": num_layers,
        "num_attention_heads": attention_heads, "num_key_value_heads": max(1, attention_heads // 2),
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False, "pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.bos_token_id,
    }
    config = AutoConfig.for_model(model_type, **{**sizes, **ARCHITECTURES[model_type]})
    if with_weights:
        import torch
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config).to(torch.float32)
        for parameter in model.parameters():  # wider than the default init, so layers differ visibly
            torch.nn.init.normal_(parameter, std=0.2) if parameter.dim() > 1 else None
        model.save_pretrained(str(out))
    else:
        config.save_pretrained(str(out))
    return out


def train_tiny_target(target: Path, conversations: list[list[dict[str, str]]], steps: int = 120,
                      batch_size: int = 16, lr: float = 3e-3, seed: int = 0) -> Path:
    """Train the weights of a tiny target in place as a causal LM on `conversations` (chat-template
    rendered), so that its next-token distributions are peaked and learnable like a real model's;
    return `target`. A few dozen seconds on a CPU."""
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)
    for parameter in model.parameters():
        if parameter.dim() > 1:
            torch.nn.init.normal_(parameter, std=0.02)
    rows = [tokenizer.apply_chat_template(c, tokenize=True, return_dict=False) for c in conversations]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = random.Random(seed)
    for _ in range(steps):
        batch = rng.sample(rows, min(batch_size, len(rows)))
        width = max(map(len, batch))
        input_ids = torch.full((len(batch), width), tokenizer.pad_token_id)  # [B, T]
        attention = torch.zeros(len(batch), width, dtype=torch.long)  # [B, T]
        for row, ids in enumerate(batch):
            input_ids[row, :len(ids)] = torch.tensor(ids)
            attention[row, :len(ids)] = 1
        loss = model(input_ids=input_ids, attention_mask=attention, labels=input_ids.masked_fill(attention == 0, -100)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(str(target))
    return target


def save_spaced_draft(target: Path, out: Path) -> Path:
    """Save an eyas draft for `target` to `out` (random weights, aux ids [1, 2, 3] in the input convention, 40 draft
    ids: draft id i is target id 3i, strictly increasing) and return `out`; weightless targets do."""
    import torch

    from eyas.draft.config import draft_config_for_target
    from eyas.draft.model import Eagle3Draft, save_draft
    from eyas.models.load import load_config

    draft = Eagle3Draft(draft_config_for_target(load_config(target), [1, 2, 3], 40, None))
    with torch.no_grad():
        draft.d2t.copy_(torch.arange(40) * 2)
        draft.t2d[torch.arange(40) * 3] = True
    save_draft(draft, out)
    return out


def main(argv: list[str] | None = None) -> None:
    """`python -m eyas.testing.tiny OUT [--style STYLE]`: write a tiny target directory."""
    import argparse

    parser = argparse.ArgumentParser(description="Write a tiny offline target (tokenizer, chat template, config).")
    parser.add_argument("out", type=Path)
    parser.add_argument("--style", choices=STYLES, default="chatml")
    parser.add_argument("--architecture", choices=sorted(ARCHITECTURES), default=None)
    parser.add_argument("--with-weights", action="store_true", help="also write random weights (safetensors)")
    args = parser.parse_args(argv)
    written = build_tiny_target(args.out, args.style, architecture=args.architecture, with_weights=args.with_weights)
    print(f"tiny {args.style} target written to {written}")


if __name__ == "__main__":
    main()
