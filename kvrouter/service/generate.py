"""The router's proxied Generate: validate, route, then drive the request
through the workers (`ProxiedRequest`) and stream its tokens back.

Every accepted request ends in a finished stream or a gRPC status within
its deadline (the client's, or `default_timeout_s`): INVALID_ARGUMENT for
bad input, NOT_FOUND for a model no worker serves, UNAVAILABLE when none of
the model's workers is left, DEADLINE_EXCEEDED. A client
that cancels cancels the worker calls, which abort on the workers.
"""

from __future__ import annotations

import itertools
import logging
import os
from array import array
from contextlib import aclosing

import grpc

from kvrouter.net.credentials import Credentials
from kvrouter.policy import NoWorkerAvailable, Router, UnknownModel
from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.service.config import ServiceConfig
from kvrouter.service.convert import (
    check_model,
    check_namespace,
    check_prompt_array,
    check_sampling,
    prompt_tokens,
)
from kvrouter.service.errors import ServiceError, invalid
from kvrouter.service.proxied_request import ProxiedRequest, prompt_array
from kvrouter.service.proxy_config import ProxyConfig
from kvrouter.service.proxy_context import ProxyContext
from kvrouter.service.routing import MAX_REQUEST_ID_CHARS, RouterService
from kvrouter.service.worker_calls import Deadline, RequestFailed
from kvrouter.service.workers import MAX_MODEL_CHARS, WorkerTable

log = logging.getLogger("kvrouter.service.generate")


class GenerationProxy:
    def __init__(
        self, policy: Router, workers: WorkerTable, config: ServiceConfig, proxy: ProxyConfig
    ) -> None:
        proxy.validate()
        self.config = config
        credentials = Credentials.from_files(
            config.worker_token_file,
            config.worker_ca_file,
            config.worker_cert_file,
            config.worker_key_file,
        )
        self.ctx = ProxyContext(policy, workers, proxy, credentials)
        self._ids = itertools.count()
        self._id_prefix = os.urandom(4).hex()

    def _validate(
        self, request: gen.GenerateRequest, prompt: array | None
    ) -> tuple[bytes | list[int] | array, str]:
        if prompt is None:
            prompt = prompt_tokens(request, self.config.max_prompt_tokens)
        else:
            check_prompt_array(request, prompt, self.config.max_prompt_tokens)
        check_namespace(request.namespace, self.config.max_namespace_chars)
        check_model(request.model, MAX_MODEL_CHARS)
        check_sampling(request.sampling)
        request_id = request.request_id or f"{self._id_prefix}-g{next(self._ids)}"
        if len(request_id) > MAX_REQUEST_ID_CHARS:
            raise invalid(f"request_id is longer than {MAX_REQUEST_ID_CHARS} characters")
        return prompt, request_id

    async def generate(self, request: gen.GenerateRequest, context):
        """The Generate call: `stream` with the call's deadline, its refusals
        and failures as the call's status."""
        remaining = context.time_remaining()
        try:
            async with aclosing(self.stream(request, remaining)) as chunks:
                async for chunk in chunks:
                    yield chunk
        except ServiceError as e:
            await context.abort(e.code, e.message)

    async def stream(
        self, request: gen.GenerateRequest, timeout_s: float | None, prompt: array | None = None
    ):
        """The request's chunks, routed and driven through the workers within
        `timeout_s` (None: `default_timeout_s`); `request.request_id` is set
        to the id it runs under. ServiceError when it is
        refused or fails. Closing the stream early cancels the request on
        the workers; either way its booking is closed. `prompt`: the
        prompt's ids as an array('I'), from a caller that has them so and
        leaves the request's token fields empty (the front door): no copy
        of them is made unless a kvrouter worker is sent the request."""
        prompt, request_id = self._validate(request, prompt)
        deadline = Deadline(self.ctx.config.default_timeout_s if timeout_s is None else timeout_s)
        try:
            decision = self.ctx.policy.route(
                request_id,
                prompt,
                request.namespace,
                model=request.model,
                session=request.session_id,
            )
        except UnknownModel as e:
            raise ServiceError(grpc.StatusCode.NOT_FOUND, str(e)) from None
        except NoWorkerAvailable as e:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, str(e)) from None
        except ValueError as e:
            raise invalid(str(e)) from None
        # The workers are sent the request as it came, under the id chosen.
        request.request_id = request_id
        tokens = prompt if isinstance(prompt, array) else prompt_array(prompt)
        run = ProxiedRequest(self.ctx, request, tokens, decision, deadline)
        finished = False
        try:
            async with aclosing(run.stream()) as chunks:
                async for chunk in chunks:
                    yield chunk
            finished = True
        except RequestFailed as e:
            log.warning(
                "request failed",
                extra={
                    "fields": {"request_id": request_id, "code": e.code.name, "error": e.message}
                },
            )
            raise ServiceError(e.code, e.message) from None
        finally:
            run.cleanup()
            if finished:
                self.ctx.policy.finished(request_id)
            else:
                self.ctx.policy.cancelled(request_id)

    async def close(self) -> None:
        await self.ctx.close()


class ProxyingRouterService(RouterService):
    """The Router service with proxied generation."""

    def __init__(self, *args, generation: GenerationProxy, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.generation = generation

    async def Generate(self, request, context):
        # grpc.aio recognises a streaming handler by its being an async generator.
        async with aclosing(self.generation.generate(request, context)) as chunks:
            async for chunk in chunks:
                yield chunk
