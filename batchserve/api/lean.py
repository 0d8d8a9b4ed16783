"""Routes that resolve their parameters in a few direct steps, falling back to FastAPI's own.

FastAPI's generic request handler re-derives, on every request, what each dependency is and
how to cache it (its dependency solver inspects callables and scopes per call), and runs its
telemetry and content-type machinery: about 0.1 ms of CPU an HTTP request on this API's routes,
a tenth of a submit's (docs/frontdoor.md, "Routes resolve their parameters directly"). A
``LeanRoute`` compiles, once, a plan for its endpoint: which dependencies to call with the
request, which path, query and header parameters to read and through which pydantic adapter
to validate each, and the JSON body's model. A request that the plan resolves without a
single problem runs the endpoint with those values. Any other request (a missing or invalid
parameter, a body that is not JSON, a dependency override, a request FastAPI's OpenTelemetry
integration is tracing) is handed, untouched, to FastAPI's own handler, so every refusal is
worded exactly as FastAPI words it, and the OpenAPI document is FastAPI's, from the same
signatures.

What the plan does not cover (forms, cookies, sequences, generator dependencies, security
scopes, background tasks, an endpoint not declared to return a ``Response``) leaves the route
on FastAPI's handler entirely.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

import orjson
from fastapi import params, routing
from fastapi.routing import APIRoute
from fastapi.telemetry import get_telemetry_data
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response

Handler = Callable[[Request], Coroutine[Any, Any, Response]]
# Parameter types a plan reads from one string (a sequence or a model stays with FastAPI).
_SCALARS: tuple[type, ...] = (str, int, float, bool)


class _Fallback(Exception):
    """The plan cannot resolve this request: FastAPI's handler answers it."""


@dataclass(frozen=True, slots=True)
class _Param:
    name: str
    source: Literal["path", "query", "header"]
    key: str
    adapter: TypeAdapter[Any]
    required: bool
    default: Any


@dataclass(frozen=True, slots=True)
class _Plan:
    call: Callable[..., Awaitable[Any]]
    request_names: tuple[str, ...]  # parameters given the request itself
    dependencies: tuple[tuple[str | None, _Plan], ...]
    params: tuple[_Param, ...]
    body: tuple[str, type[BaseModel]] | None

    async def values(self, request: Request, body: Any, cache: dict[int, Any]) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, plan in self.dependencies:
            key = id(plan.call)
            if key in cache:
                value = cache[key]
            else:
                value = await plan.call(**await plan.values(request, body, cache))
                cache[key] = value
            if name is not None:
                values[name] = value
        for param in self.params:
            values[param.name] = _read(request, param)
        for name in self.request_names:
            values[name] = request
        if self.body is not None:
            name, model = self.body
            try:
                values[name] = model.model_validate(body)
            except ValidationError:
                raise _Fallback from None
        return values


def _read(request: Request, param: _Param) -> Any:
    if param.source == "path":
        raw = request.path_params.get(param.key)
    elif param.source == "query":
        raw = request.query_params.get(param.key)
    else:
        raw = request.headers.get(param.key)
    if raw is None:
        if param.required:
            raise _Fallback
        return param.default
    try:
        return param.adapter.validate_python(raw)
    except ValidationError:
        raise _Fallback from None


def _is_scalar(annotation: Any) -> bool:
    """A type read from one string: a scalar, a Literal of them, UUID-like classes, or an
    optional of one of those."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return all(isinstance(a, _SCALARS) for a in typing.get_args(annotation))
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return len(args) == 1 and _is_scalar(args[0])
    if origin is not None or not isinstance(annotation, type):
        return False
    if issubclass(annotation, BaseModel):
        return False
    return issubclass(annotation, _SCALARS) or annotation.__module__ == "uuid"


def _param(field: Any, source: Literal["path", "query", "header"]) -> _Param | None:
    info = field.field_info
    if not _is_scalar(info.annotation) or info.default_factory is not None:
        return None
    key = field.alias
    if source == "header":
        if isinstance(info, params.Header) and info.convert_underscores and key == field.name:
            key = key.replace("_", "-")
        key = key.lower()
    annotation: Any = info.annotation
    if info.metadata:
        annotation = Annotated[(annotation, *info.metadata)]
    adapter: TypeAdapter[Any] = TypeAdapter(annotation)
    required = bool(info.is_required())
    return _Param(field.name, source, key, adapter, required, None if required else info.default)


def _async_call(call: Any) -> Callable[..., Awaitable[Any]] | None:
    if inspect.iscoroutinefunction(call):
        return typing.cast("Callable[..., Awaitable[Any]]", call)
    method = getattr(call, "__call__", None)  # noqa: B004 - a callable instance's own method
    if method is not None and not inspect.isfunction(call) and inspect.iscoroutinefunction(method):
        return typing.cast("Callable[..., Awaitable[Any]]", call)
    return None


def _compile(dependant: Any, body_field: Any, embed: bool, *, endpoint: bool) -> _Plan | None:
    call = _async_call(dependant.call)
    if call is None or not dependant.use_cache or dependant.cookie_params:
        return None
    if any(
        getattr(dependant, name, None)
        for name in (
            "websocket_param_name",
            "response_param_name",
            "background_tasks_param_name",
            "security_scopes_param_name",
            "own_oauth_scopes",
            "concurrency",
        )
    ):
        return None
    dependencies: list[tuple[str | None, _Plan]] = []
    for sub in dependant.dependencies:
        plan = _compile(sub, None, False, endpoint=False)
        if plan is None:
            return None
        dependencies.append((sub.name, plan))
    fields: list[_Param] = []
    sources: tuple[tuple[Literal["path", "query", "header"], list[Any]], ...] = (
        ("path", dependant.path_params),
        ("query", dependant.query_params),
        ("header", dependant.header_params),
    )
    for source, group in sources:
        for field in group:
            param = _param(field, source)
            if param is None:
                return None
            fields.append(param)
    body: tuple[str, type[BaseModel]] | None = None
    if dependant.body_params:
        if not endpoint or embed or len(dependant.body_params) != 1 or body_field is None:
            return None
        field = dependant.body_params[0]
        info = field.field_info
        model = info.annotation
        if (
            not isinstance(info, params.Body)
            or isinstance(info, params.Form)
            or info.metadata
            or not (isinstance(model, type) and issubclass(model, BaseModel))
        ):
            return None
        body = (field.name, model)
    request_names = tuple(
        name
        for name in (dependant.request_param_name, dependant.http_connection_param_name)
        if name is not None
    )
    return _Plan(call, request_names, tuple(dependencies), tuple(fields), body)


def _returns_response(call: Any) -> bool:
    """Whether ``call`` is declared to return a ``Response``: its return annotation, or under
    postponed annotations the name it spells, looked up in the function's module."""
    returned = getattr(call, "__annotations__", {}).get("return")
    if isinstance(returned, str):
        value: Any = getattr(call, "__globals__", {})
        for i, part in enumerate(returned.split(".")):
            value = value.get(part) if i == 0 else getattr(value, part, None)
            if value is None:
                return False
        returned = value
    return isinstance(returned, type) and issubclass(returned, Response)


def _json_content(request: Request) -> bool:
    content_type = request.headers.get("content-type")
    if content_type is None:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


class LeanRoute(APIRoute):
    """An ``APIRoute`` whose requests take the compiled plan when it resolves them."""

    lean: bool = False  # whether this route's handler has a plan (tests read it)

    def get_route_handler(self) -> Handler:
        generic = super().get_route_handler()
        route: Any = self
        # Included into another router, FastAPI builds the handler for the effective route
        # (the includer's prefix and dependencies merged in) under this context variable.
        context_var = getattr(routing, "_effective_route_context_var", None)
        if context_var is None:
            return generic
        context = context_var.get()
        if context is not None and getattr(context, "original_route", None) is self:
            route = context
        dependant = route.dependant
        if not _returns_response(dependant.call):
            return generic
        plan = _compile(dependant, route.body_field, bool(route._embed_body_fields), endpoint=True)
        if plan is None:
            return generic
        overrides = route.dependency_overrides_provider
        self.lean = True

        async def handler(request: Request) -> Response:
            if overrides is not None and getattr(overrides, "dependency_overrides", None):
                return await generic(request)
            if get_telemetry_data() is not None:  # traced: FastAPI records its operations
                return await generic(request)
            body: Any = None
            if plan.body is not None:
                raw = await request.body()  # cached on the request for the fallback
                if not raw or not _json_content(request):
                    return await generic(request)
                try:
                    body = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    return await generic(request)
            try:
                values = await plan.values(request, body, {})
            except _Fallback:
                return await generic(request)
            response = await plan.call(**values)
            if not isinstance(response, Response):
                raise TypeError(f"{plan.call.__name__} must return a Response")
            return response

        return handler
