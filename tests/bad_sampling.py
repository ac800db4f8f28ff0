"""Sampling settings every entry point must refuse with INVALID_ARGUMENT,
each with the field its message names. On a worker, each once failed every
request in its batch and was retried on every other worker."""

BAD_SAMPLING = [
    ({"temperature": float("nan")}, "sampling.temperature"),
    ({"temperature": float("inf")}, "sampling.temperature"),
    ({"temperature": -1.0}, "sampling.temperature"),
    ({"temperature": 1e-45}, "sampling.temperature"),
    ({"temperature": 0.001}, "sampling.temperature"),
    ({"temperature": 1.0, "top_p": float("nan")}, "sampling.top_p"),
    ({"temperature": 1.0, "top_p": 1.5}, "sampling.top_p"),
    ({"temperature": 1.0, "top_p": -0.5}, "sampling.top_p"),
    ({"logprobs": 21}, "sampling.logprobs"),
]
