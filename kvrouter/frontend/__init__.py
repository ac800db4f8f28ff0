"""The tokenization layer of the OpenAI-compatible front door: a model's
tokenizer and chat template (`ModelTokenizer`), streaming detokenization
(`Detokenizer`), stop strings and stop token ids (`StopMatcher`,
`TextStream`), and each token's own text and bytes (`TokenTexts`). Needs
the `frontend` extra (tokenizers, jinja2); see docs/frontend.md."""

from kvrouter.frontend.detokenizer import Detokenizer
from kvrouter.frontend.stop import StopMatcher
from kvrouter.frontend.text_stream import TextStream
from kvrouter.frontend.token_text import TokenTexts
from kvrouter.frontend.tokenizer import ModelTokenizer, Prompt

__all__ = ["Detokenizer", "ModelTokenizer", "Prompt", "StopMatcher", "TextStream", "TokenTexts"]
