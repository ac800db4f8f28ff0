"""Chat templates render as transformers' apply_chat_template renders them."""

import asyncio
import json
import shutil

import pytest
from transformers import AutoTokenizer

from kvrouter.engine.tiny_tokenizer import CHAT_TEMPLATE
from kvrouter.frontend import ModelTokenizer

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system-user": [SYSTEM, {"role": "user", "content": "What is 2+2?"}],
    "multi-turn": [
        SYSTEM,
        {"role": "user", "content": "Hi, who are you?"},
        {"role": "assistant", "content": "An assistant. 你好 😀"},
        {"role": "user", "content": "Tell me a joke.\nA short one."},
    ],
    "parts": [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Part one. "}, {"type": "text", "text": "Two."}],
        },
    ],
    "none-field": [{"role": "user", "content": "Hi", "name": None}],
}


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("name", CONVERSATIONS)
def test_tiny_template_renders_as_transformers(
    tokenizer, hf_tokenizer, name, add_generation_prompt
):
    messages = CONVERSATIONS[name]
    prompt = tokenizer.render_and_encode(messages, add_generation_prompt=add_generation_prompt)
    assert prompt.text == hf_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert prompt.token_ids.tolist() == hf_tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, return_dict=False
    )
    assert prompt.text.startswith("<|begin_of_text|><|im_start|>")
    assert prompt.text.endswith("<|im_start|>assistant\n") == add_generation_prompt


def test_render_and_encode_async_is_render_and_encode(tokenizer):
    messages = CONVERSATIONS["multi-turn"]
    prompt = asyncio.run(tokenizer.render_and_encode_async(messages))
    assert prompt == tokenizer.render_and_encode(messages)


def model_with(model_dir, tmp_path, config: dict, files: dict[str, str] = {}):  # noqa: B006
    """A copy of the tiny model's tokenizer with `config` over its
    tokenizer_config.json and `files` added, loaded by both."""
    shutil.copy(model_dir / "tokenizer.json", tmp_path)
    base = json.loads((model_dir / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**base, **config}))
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return ModelTokenizer.from_dir(tmp_path), AutoTokenizer.from_pretrained(tmp_path)


# A template with what transformers adds to jinja: tojson (no HTML escapes),
# raise_exception, strftime_now, loop controls, namespace, {% generation %}.
FEATURES_TEMPLATE = """
{%- set ns = namespace(turns=0) %}
{%- for message in messages %}
    {%- if message.role == 'tool' %}{% continue %}{% endif %}
    {%- if message.role not in ['system', 'user', 'assistant'] %}
        {{- raise_exception('unknown role ' + message.role) }}
    {%- endif %}
    {%- set ns.turns = ns.turns + 1 %}
    {%- if message.role == 'assistant' %}
        {% generation %}{{ message.content | tojson }}{% endgeneration %}
    {%- else %}
        {{ message.role }}: {{ message.content | tojson(indent=2) }}
    {% endif %}
{%- endfor %}
turns={{ ns.turns }} year={{ strftime_now('%Y')[:2] }}
{%- if tools is not none %} tools={{ tools | tojson }}{% endif %}
{%- if add_generation_prompt %}<assistant>{% endif %}
"""

FEATURE_MESSAGES = [
    {"role": "user", "content": '<b>bold</b> & "quoted" — ünïcödé'},
    {"role": "tool", "content": "skipped"},
    {"role": "assistant", "content": "a <tag>"},
]


def test_transformers_jinja_features_render_the_same(model_dir, tmp_path):
    ours, theirs = model_with(model_dir, tmp_path, {"chat_template": FEATURES_TEMPLATE})
    tools = [{"type": "function", "function": {"name": "f<x>", "parameters": {}}}]
    for kwargs in ({}, {"tools": tools}, {"add_generation_prompt": True}):
        assert ours.render_chat(
            FEATURE_MESSAGES, add_generation_prompt=kwargs.get("add_generation_prompt", False),
            tools=kwargs.get("tools"),
        ) == theirs.apply_chat_template(FEATURE_MESSAGES, tokenize=False, **kwargs)  # fmt: skip


def test_named_templates_pick_default_or_tool_use(model_dir, tmp_path):
    named = [
        {"name": "default", "template": "D{{ messages[0].content }}"},
        {"name": "tool_use", "template": "T{{ tools | length }}{{ messages[0].content }}"},
    ]
    ours, theirs = model_with(model_dir, tmp_path, {"chat_template": named})
    messages = [{"role": "user", "content": "x"}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert ours.render_chat(messages) == "Dx"
    assert ours.render_chat(messages, tools=tools) == "T1x"
    assert ours.render_chat(messages, add_generation_prompt=False) == (
        theirs.apply_chat_template(messages, tokenize=False)
    )
    assert ours.render_chat(messages, tools=tools) == theirs.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )


def test_template_files_take_priority_over_the_config(model_dir, tmp_path):
    files = {
        "chat_template.jinja": "file:{{ messages[0].content }}",
        "additional_chat_templates/tool_use.jinja": "tools:{{ messages[0].content }}",
    }
    ours, theirs = model_with(model_dir, tmp_path, {}, files)
    messages = [{"role": "user", "content": "x"}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    for kwargs in ({}, {"tools": tools}):
        assert ours.render_chat(messages, **kwargs) == theirs.apply_chat_template(
            messages, tokenize=False, **kwargs
        )
    assert ours.render_chat(messages) == "file:x"


def test_a_string_only_template_gets_text_parts_joined(model_dir, tmp_path):
    template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    ours, theirs = model_with(model_dir, tmp_path, {"chat_template": template})
    parts = [{"role": "user", "content": [{"type": "text", "text": t} for t in ("a", "b")]}]
    joined = [{"role": "user", "content": "a\nb"}]
    assert ours.render_chat(parts) == "[a\nb]"
    assert ours.render_chat(parts) == theirs.apply_chat_template(joined, tokenize=False)


def test_the_tiny_template_is_the_one_written(tokenizer):
    assert tokenizer.render_chat([{"role": "user", "content": "q"}]) == (
        "<|begin_of_text|><|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "add_generation_prompt" in CHAT_TEMPLATE


BAD_MESSAGES = {
    "not a list": ({"role": "user"}, "messages must be a non-empty list"),
    "empty": ([], "messages must be a non-empty list"),
    "not an object": (["hi"], r"messages\[0\] must be an object"),
    "no role": ([{"content": "hi"}], r"messages\[0\].role must be a string"),
    "number content": ([{"role": "user", "content": 3}], "must be a string or a list of parts"),
    "image part": (
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        "content part type 'image_url' is not supported",
    ),
    "part without text": (
        [{"role": "user", "content": [{"type": "text"}]}],
        r"messages\[0\].content\[0\].text must be a string",
    ),
}


@pytest.mark.parametrize("name", BAD_MESSAGES)
def test_bad_messages_are_one_line_value_errors(tokenizer, name):
    messages, message = BAD_MESSAGES[name]
    with pytest.raises(ValueError, match=message) as error:
        tokenizer.render_chat(messages)
    assert "\n" not in str(error.value)


def test_a_template_that_raises_is_a_value_error(model_dir, tmp_path):
    ours, _ = model_with(model_dir, tmp_path, {"chat_template": FEATURES_TEMPLATE})
    with pytest.raises(ValueError, match="^chat template: unknown role robot$"):
        ours.render_chat([{"role": "robot", "content": "beep"}])


def test_a_template_failing_on_the_data_is_a_value_error(model_dir, tmp_path):
    ours, _ = model_with(model_dir, tmp_path, {"chat_template": "{{ messages[0].content + 1 }}"})
    with pytest.raises(ValueError, match="^chat template: "):
        ours.render_chat([{"role": "user", "content": "x"}])


def test_the_sandbox_refuses_python_internals(model_dir, tmp_path):
    template = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    ours, _ = model_with(model_dir, tmp_path, {"chat_template": template})
    with pytest.raises(ValueError, match="^chat template: "):
        ours.render_chat([{"role": "user", "content": "x"}])


def test_no_template_is_a_value_error(model_dir, tmp_path):
    ours, _ = model_with(model_dir, tmp_path, {"chat_template": None})
    with pytest.raises(ValueError, match="no chat template"):
        ours.render_chat([{"role": "user", "content": "x"}])


def test_named_templates_without_a_default_are_a_value_error(model_dir, tmp_path):
    named = [{"name": "tool_use", "template": "T"}]
    ours, _ = model_with(model_dir, tmp_path, {"chat_template": named})
    with pytest.raises(ValueError, match=r"chat templates \(tool_use\) have no 'default'"):
        ours.render_chat([{"role": "user", "content": "x"}])


def test_a_template_that_does_not_compile_fails_at_load(model_dir, tmp_path):
    with pytest.raises(ValueError, match="chat template does not compile"):
        model_with(model_dir, tmp_path, {"chat_template": "{% for %}"})
