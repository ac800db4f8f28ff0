"""Hypothesis settings for the fuzz tests. CI runs a few hundred inputs per
target; `KVROUTER_FUZZ_EXAMPLES=N` (what `bench/fuzz.py` sets) runs N."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "kvrouter-fuzz",
    max_examples=int(os.environ.get("KVROUTER_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)
fuzz_settings = settings.get_profile("kvrouter-fuzz")
