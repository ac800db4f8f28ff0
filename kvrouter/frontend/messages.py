"""Chat messages as an OpenAI request has them, checked and shaped for a
chat template."""

from __future__ import annotations

from collections.abc import Mapping


def template_messages(messages: object, *, content_as_parts: bool) -> list[dict]:
    """The messages a template renders: keys whose value is None dropped (as
    transformers does: templates handle a missing key better than None).
    Content is a string or a list of text parts; for a template that takes
    only strings (`content_as_parts` false) the parts' texts are joined with
    newlines, as vLLM does."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    shaped = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{index}] must be an object")
        if not isinstance(message.get("role"), str):
            raise ValueError(f"messages[{index}].role must be a string")
        message = {key: value for key, value in message.items() if value is not None}
        content = message.get("content")
        if isinstance(content, list):
            texts = _part_texts(index, content)
            if not content_as_parts:
                message["content"] = "\n".join(texts)
        elif content is not None and not isinstance(content, str):
            raise ValueError(f"messages[{index}].content must be a string or a list of parts")
        shaped.append(message)
    return shaped


def _part_texts(index: int, parts: list) -> list[str]:
    texts = []
    for number, part in enumerate(parts):
        where = f"messages[{index}].content[{number}]"
        if not isinstance(part, Mapping):
            raise ValueError(f"{where} must be an object")
        if part.get("type") != "text":
            raise ValueError(f"{where}: content part type {part.get('type')!r} is not supported")
        if not isinstance(part.get("text"), str):
            raise ValueError(f"{where}.text must be a string")
        texts.append(part["text"])
    return texts
