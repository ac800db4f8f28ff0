"""The Llama/Qwen2 decoder and its checkpoint loader."""
