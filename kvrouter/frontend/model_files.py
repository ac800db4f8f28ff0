"""What a model directory says about its tokenizer, read as transformers
reads it: tokenizer.json, the special tokens and chat templates of
tokenizer_config.json, chat_template.jinja and additional_chat_templates/
(which take priority over the config's templates), generation_config.json's
eos ids, and the context length: config.json's max_position_embeddings, as
vLLM takes it, else tokenizer_config.json's model_max_length."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

# The named special tokens a chat template sees as variables (bos_token, ...).
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
DEFAULT_TEMPLATE = "default"
# transformers writes a huge model_max_length (1e30) when it knows none.
MAX_CREDIBLE_CONTEXT = 1 << 24


@dataclass(frozen=True)
class TokenizerFiles:
    tokenizer: Tokenizer
    special_tokens: dict[str, str]
    # Each id that ends generation: the eos token's, then generation_config's.
    eos_token_ids: tuple[int, ...]
    # Chat templates by name; a single template is named "default".
    chat_templates: dict[str, str]
    # Prompt and completion tokens the model takes together; None: unknown.
    max_model_len: int | None


def read_tokenizer_files(directory: str | Path) -> TokenizerFiles:
    directory = Path(directory)
    tokenizer_file = directory / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ValueError(f"{directory} has no tokenizer.json")
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as e:  # tokenizers raises a bare Exception for a bad file
        raise ValueError(f"{tokenizer_file} does not load: {e}") from None
    config = _json(directory / "tokenizer_config.json")
    special_tokens = {
        name: _token_text(config[name]) for name in SPECIAL_TOKEN_NAMES if config.get(name)
    }
    eos_ids = []
    if "eos_token" in special_tokens:
        eos_ids.append(tokenizer.token_to_id(special_tokens["eos_token"]))
    generation_eos = _json(directory / "generation_config.json").get("eos_token_id")
    eos_ids.extend(generation_eos if isinstance(generation_eos, list) else [generation_eos])
    eos_token_ids = tuple(dict.fromkeys(i for i in eos_ids if isinstance(i, int)))
    return TokenizerFiles(
        tokenizer=tokenizer,
        special_tokens=special_tokens,
        eos_token_ids=eos_token_ids,
        chat_templates=_template_files(directory) or _config_templates(config),
        max_model_len=_context_length(_json(directory / "config.json"), config),
    )


def _context_length(model_config: dict, tokenizer_config: dict) -> int | None:
    for length in (
        model_config.get("max_position_embeddings"),
        tokenizer_config.get("model_max_length"),
    ):
        if isinstance(length, int | float) and 0 < length < MAX_CREDIBLE_CONTEXT:
            return int(length)
    return None


def _json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON: {e}") from None


def _token_text(token: str | dict) -> str:
    # A token is its text, or an AddedToken's fields {"content": ..., ...}.
    return token["content"] if isinstance(token, dict) else token


def _template_files(directory: Path) -> dict[str, str]:
    templates = {}
    if (directory / "chat_template.jinja").is_file():
        templates[DEFAULT_TEMPLATE] = (directory / "chat_template.jinja").read_text("utf-8")
    for path in sorted((directory / "additional_chat_templates").glob("*.jinja")):
        templates[path.name.removesuffix(".jinja")] = path.read_text("utf-8")
    return templates


def _config_templates(config: dict) -> dict[str, str]:
    # A string, or a list of {"name": ..., "template": ...}.
    template = config.get("chat_template")
    if isinstance(template, str):
        return {DEFAULT_TEMPLATE: template}
    if isinstance(template, list):
        return {entry["name"]: entry["template"] for entry in template}
    return {}
