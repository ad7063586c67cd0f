"""Helpers the API-side patches share: find a vLLM attribute (probe) and hook a pydantic model or a method.

Pydantic compiles a model's validators into its schema when the class is created, so a validator added
later only takes effect after `model_rebuild(force=True)`. FastAPI builds its request validator from the
model's schema when the route is created; vLLM creates the OpenAI routes after it loads the plugins
(`vllm.plugins.load_general_plugins` runs while the engine arguments are parsed), so a rebuild at
`register()` time reaches the server. The added validators are pydantic's own machinery (a
`Decorator` in `__pydantic_decorators__`), the same record a `@model_validator` in the class body makes.

A model serializer (`AddedSerializer`) is added the same way: it changes what a model's dump says without
changing its attributes, for a field vLLM reads itself (`ErrorInfo.code` is the response's HTTP status).

`api_patch` builds an API-side patch's `PATCH` from its switch, its probe and its hooks (`WrappedMethod`,
`AddedValidator`, `AddedSerializer`), which install and uninstall from the same declaration; a patch module
then holds only its seam and its fix.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from .registry import Patch

__all__ = ["attribute_problem", "first_problem", "signature_problem", "model_problem", "source_problem", "pydantic_problem", "resolve",
           "add_model_validator", "remove_model_validator", "has_model_validator", "add_model_serializer",
           "remove_model_serializer", "wrap_method", "unwrap_method", "is_wrapped",
           "WrappedMethod", "AddedValidator", "AddedSerializer", "serializer_problem", "api_patch"]

_WRAPPED = "__qwen36_original__"


def resolve(path: str) -> Any:
    """`module.sub:Class.attr` -> the object."""
    module_name, _, attr_path = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr_path.split(".") if attr_path else ():
        obj = getattr(obj, part)
    return obj


def attribute_problem(path: str) -> str | None:
    """None when `path` resolves, else why not (a probe's reason for `not applicable`)."""
    module_name, _, attr_path = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        return f"{module_name} cannot be imported ({exc})"
    seen = module_name
    for part in attr_path.split(".") if attr_path else ():
        if not hasattr(obj, part):
            return f"{seen} has no {part}"
        obj, seen = getattr(obj, part), f"{seen}.{part}"
    return None


def first_problem(*paths: str) -> str | None:
    """None when every path resolves, else why the first that does not is missing."""
    return next((p for p in map(attribute_problem, paths) if p is not None), None)


def signature_problem(what: str, fn: Callable | None, expected: tuple[str, ...]) -> str | None:
    """None when `fn` (named `what` in the reason) takes exactly the parameters `expected`, else why not."""
    if fn is None:
        return f"{what} is missing"
    params = tuple(inspect.signature(fn).parameters)
    return None if params == expected else f"{what}{params} differs from the expected {expected}"


def source_problem(path: str, name: str) -> str | None:
    """None when the source of `path` still uses `name` (a private attribute a patch relies on), else why not."""
    if name in inspect.getsource(resolve(path)):
        return None
    return f"{path.rpartition(':')[2]} no longer uses {name}"


def model_problem(path: str, fields: tuple[str, ...]) -> str | None:
    """None when `path` is a pydantic v2 model with `fields` whose validators can be extended here."""
    if (problem := attribute_problem(path)) is not None:
        return problem
    model = resolve(path)
    if (problem := pydantic_problem(model)) is not None:
        return problem
    missing = sorted(set(fields) - set(model.model_fields))
    return f"{model.__name__} has no {', '.join(missing)} field" if missing else None


def pydantic_problem(model: Any) -> str | None:
    """None when `model` is a pydantic v2 model whose validators can be extended here."""
    try:
        from pydantic import BaseModel
        from pydantic._internal._decorators import Decorator, ModelValidatorDecoratorInfo  # noqa: F401
    except ImportError as exc:
        return f"pydantic v2 internals this patch extends are missing ({exc})"
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return f"{model!r} is not a pydantic model"
    decorators = getattr(model, "__pydantic_decorators__", None)
    if not isinstance(getattr(decorators, "model_validators", None), dict):
        return f"{model.__name__} has no __pydantic_decorators__.model_validators"
    return None


def add_model_validator(model: Any, name: str, func: Callable, mode: str, rebuild: tuple = ()) -> None:
    """Add `func` as a `@model_validator(mode=...)` classmethod of `model` and rebuild it (and the models in
    `rebuild` that embed it). Idempotent: nothing happens when a validator of that name is there."""
    from pydantic._internal._decorators import Decorator, ModelValidatorDecoratorInfo

    validators = model.__pydantic_decorators__.model_validators
    if name in validators:
        return
    existing = next(iter(validators.values()), None)
    setattr(model, name, classmethod(func) if mode != "after" else func)
    validators[name] = Decorator.build(
        model, cls_var_name=name, cls_ref=existing.cls_ref if existing else None, shim=None,
        info=ModelValidatorDecoratorInfo(mode=mode))
    for m in (model, *rebuild):
        m.model_rebuild(force=True)


def remove_model_validator(model: Any, name: str, rebuild: tuple = ()) -> None:
    validators = model.__pydantic_decorators__.model_validators
    if validators.pop(name, None) is None:
        return
    if name in vars(model):
        delattr(model, name)
    for m in (model, *rebuild):
        m.model_rebuild(force=True)


def add_model_serializer(model: Any, name: str, func: Callable, rebuild: tuple = ()) -> None:
    """Add `func(self, handler, info)` as a `@model_serializer(mode="wrap")` of `model` and rebuild it (and
    the models in `rebuild` that embed it). Idempotent. Refused when the model has a serializer already: a
    pydantic model has one, and replacing vLLM's would change more than the patch means to."""
    from pydantic._internal._decorators import Decorator, ModelSerializerDecoratorInfo
    from pydantic_core import PydanticUndefined

    serializers = model.__pydantic_decorators__.model_serializers
    if name in serializers:
        return
    if serializers:
        raise ValueError(f"{model.__name__} already has a model serializer ({', '.join(serializers)})")
    setattr(model, name, func)
    serializers[name] = Decorator.build(
        model, cls_var_name=name, shim=None,
        info=ModelSerializerDecoratorInfo(mode="wrap", return_type=PydanticUndefined, when_used="always"))
    try:
        for m in (model, *rebuild):
            m.model_rebuild(force=True)
    except Exception:
        remove_model_serializer(model, name, rebuild)  # leave vLLM's model working, then report the failure
        raise


def remove_model_serializer(model: Any, name: str, rebuild: tuple = ()) -> None:
    if model.__pydantic_decorators__.model_serializers.pop(name, None) is None:
        return
    if name in vars(model):
        delattr(model, name)
    for m in (model, *rebuild):
        m.model_rebuild(force=True)


def has_model_validator(model: Any, name: str) -> bool:
    return name in model.__pydantic_decorators__.model_validators


def wrap_method(owner: Any, name: str, make_wrapper: Callable[[Callable], Callable]) -> None:
    """Replace `owner.name` by `make_wrapper(original)` once (idempotent)."""
    current = getattr(owner, name)
    if is_wrapped(current):
        return
    wrapper = make_wrapper(current)
    setattr(wrapper, _WRAPPED, current)
    setattr(owner, name, wrapper)


def unwrap_method(owner: Any, name: str) -> None:
    current = owner.__dict__.get(name)
    if current is not None and is_wrapped(current):
        setattr(owner, name, getattr(current, _WRAPPED))


def is_wrapped(fn: Any) -> bool:
    return hasattr(fn, _WRAPPED)


@dataclass(frozen=True)
class WrappedMethod:
    """`owner.method` (owner a `module:Class` path) replaced by `make_wrapper(original)`."""
    owner: str
    method: str
    make_wrapper: Callable[[Callable], Callable]

    def install(self) -> None:
        wrap_method(resolve(self.owner), self.method, self.make_wrapper)

    def uninstall(self) -> None:
        unwrap_method(resolve(self.owner), self.method)


@dataclass(frozen=True)
class AddedValidator:
    """A `mode="before"` model validator `name` on the pydantic model at `model`: `func(data) -> data`.
    `rebuild`: the models that embed it, rebuilt with it."""
    model: str
    name: str
    func: Callable[[Any], Any]
    rebuild: tuple[str, ...] = ()

    def install(self) -> None:
        func = self.func
        add_model_validator(resolve(self.model), self.name, lambda cls, data: func(data), mode="before",
                            rebuild=tuple(map(resolve, self.rebuild)))

    def uninstall(self) -> None:
        remove_model_validator(resolve(self.model), self.name, rebuild=tuple(map(resolve, self.rebuild)))


@dataclass(frozen=True)
class AddedSerializer:
    """A wrap model serializer `name` on the pydantic model at `model`: `func(instance, dumped) -> dumped`
    rewrites the dump (model_dump, model_dump_json, FastAPI's response) and leaves the attributes as they
    are. `rebuild`: the models that embed it, rebuilt with it."""
    model: str
    name: str
    func: Callable[[Any, dict], dict]
    rebuild: tuple[str, ...] = ()

    def install(self) -> None:
        func = self.func

        def serialize(self, handler, info):  # pydantic requires the name `self`
            dumped = handler(self)
            return func(self, dumped) if isinstance(dumped, dict) else dumped

        add_model_serializer(resolve(self.model), self.name, serialize, rebuild=tuple(map(resolve, self.rebuild)))

    def uninstall(self) -> None:
        remove_model_serializer(resolve(self.model), self.name, rebuild=tuple(map(resolve, self.rebuild)))


def serializer_problem(path: str, name: str) -> str | None:
    """None when the model at `path` has no model serializer but (maybe) ours, so one can be added."""
    if (problem := attribute_problem(path)) is not None:
        return problem
    model = resolve(path)
    if (problem := pydantic_problem(model)) is not None:
        return problem
    others = [n for n in model.__pydantic_decorators__.model_serializers if n != name]
    return f"{model.__name__} has its own model serializer ({', '.join(others)})" if others else None


def api_patch(name: str, switch: str, seam: str, probe: Callable[[], str | None],
              hooks: tuple[WrappedMethod | AddedValidator | AddedSerializer, ...], detail: str) -> Patch:
    """A required API-side patch, on exactly when `switch` is (default off): installing it installs `hooks`
    (each idempotent) and reports `detail`; uninstalling removes them."""
    def install(settings) -> str:
        for hook in hooks:
            hook.install()
        return detail

    def uninstall() -> None:
        for hook in hooks:
            hook.uninstall()

    return Patch(name=name, seam=seam, required=True, switch=switch, kind="api", probe=probe, install=install,
                 uninstall=uninstall)
