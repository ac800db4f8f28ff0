"""Chat templates rendered as transformers renders them
(`transformers.utils.chat_template_utils`): a sandboxed, immutable jinja2
environment with trim_blocks and lstrip_blocks, loop controls, the
`{% generation %}` tag, `raise_exception`, `strftime_now` and a `tojson`
that does not escape HTML. Templates come with model directories, so they are
untrusted code: the sandbox keeps them from reaching Python internals."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Errors of template code working on request data: each means the request
# (or the template) is bad, and becomes one ValueError.
RENDER_ERRORS = (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError)


class ChatTemplate:
    def __init__(self, source: str):
        try:
            self._template = _ENVIRONMENT.from_string(source)
            tree = _ENVIRONMENT.parse(source)
        except jinja2.TemplateSyntaxError as e:
            raise ValueError(f"chat template does not compile: {one_line(e)}") from None
        self.loops_over_content = _loops_over_content(tree)

    def render(
        self,
        messages: Sequence[Mapping],
        *,
        add_generation_prompt: bool,
        tools: Sequence[Mapping] | None,
        special_tokens: Mapping[str, str],
    ) -> str:
        try:
            return self._template.render(
                **special_tokens,
                messages=messages,
                tools=tools,
                # transformers always passes documents; some templates test
                # `documents is not none`.
                documents=None,
                add_generation_prompt=add_generation_prompt,
            )
        except RENDER_ERRORS as e:
            raise ValueError(f"chat template: {one_line(e)}") from None


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks the assistant's part
    for transformers' training masks; rendering keeps just its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: jinja2.runtime.Macro) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # jinja2's own tojson escapes <, > and & for HTML, which prompts must not have.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _loops_over_content(tree: nodes.Template) -> bool:
    """Whether the template has a `{% for ... in message['content'] %}` (or
    `.content`, through filters): it takes content as a list of parts."""
    for loop in tree.find_all(nodes.For):
        source = loop.iter
        while isinstance(source, nodes.Filter | nodes.Test):
            source = source.node
        if isinstance(source, nodes.Getattr) and source.attr == "content":
            return True
        if isinstance(source, nodes.Getitem) and getattr(source.arg, "value", None) == "content":
            return True
    return False


_ENVIRONMENT = ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
)
_ENVIRONMENT.filters["tojson"] = _tojson
_ENVIRONMENT.globals["raise_exception"] = _raise_exception
_ENVIRONMENT.globals["strftime_now"] = _strftime_now
