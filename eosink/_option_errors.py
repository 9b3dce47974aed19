"""Option errors as users read them: each invalid field with its value, secrets masked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from .util import is_secret_name, redact

_HIDDEN = "*** (hidden)"
_PREFIXES = ("Value error, ", "Assertion failed, ")


def _is_secret_type(annotation: Any) -> bool:
    from pydantic import SecretBytes, SecretStr

    if annotation in (SecretStr, SecretBytes):
        return True
    return any(_is_secret_type(a) for a in getattr(annotation, "__args__", ()) or ())


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for a in getattr(annotation, "__args__", ()) or ():
        found = _nested_model(a)
        if found is not None:
            return found
    return None


def _field_named(model: type[BaseModel], key: str) -> Any:
    for name, info in model.model_fields.items():
        if key in (name, info.alias, info.validation_alias):
            return info
    return None


def _is_secret(model: type[BaseModel], loc: Sequence[Any]) -> bool:
    """Whether the value at ``loc`` may be a secret: a SecretStr/SecretBytes field, a field
    declared with ``repr=False``, or a field or key named like a credential."""
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, str) and is_secret_name(part):
            return True
        info = _field_named(current, str(part)) if current is not None else None
        if info is not None:
            if not info.repr or _is_secret_type(info.annotation):
                return True
            current = _nested_model(info.annotation)
    return False


def _mask(value: Any) -> Any:
    """``value`` with credential-named keys of mappings hidden and URL passwords removed."""
    if isinstance(value, Mapping):
        return {
            k: _HIDDEN if isinstance(k, str) and is_secret_name(k) else _mask(v)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return type(value)(_mask(v) for v in value)
    if isinstance(value, str):
        return redact(value)
    return value


def _shown(value: Any, limit: int = 120) -> str:
    text = repr(_mask(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_option_errors(model: type[BaseModel], exc: Any) -> str:
    """One line for a pydantic ``ValidationError`` of a sink's options model.

    Per problem: the field, what is wrong or allowed (pydantic's message without its
    ``Value error,`` boilerplate, or the validator's own message) and the value given,
    unless the message already shows it. A value that may be a secret (a ``SecretStr`` or
    ``SecretBytes`` field, a field with ``repr=False``, a field or key named like a password,
    token, key or credential) is never shown; credential-named keys inside a dict and the
    password of a URL are masked in any value. Unknown options list the sink's options and
    never show their value (a misspelt credential key is still a credential).
    """
    problems: list[str] = []
    unknown = False
    for e in exc.errors():
        loc = tuple(e.get("loc", ()))
        where = ".".join(str(p) for p in loc)
        kind = e.get("type", "")
        msg = str(e.get("ctx", {}).get("error", "")) if kind == "value_error" else ""
        msg = msg or str(e.get("msg", ""))
        for prefix in _PREFIXES:
            msg = msg.removeprefix(prefix)
        secret = _is_secret(model, loc)
        value = e.get("input")
        if secret and isinstance(value, (str, bytes)) and len(value) >= 4:
            msg = msg.replace(repr(value), _HIDDEN).replace(str(value), _HIDDEN)
        if kind == "missing":
            problems.append(f"{where}: required, not given")
            continue
        if not loc:  # a model validator: its message says what is wrong
            problems.append(msg)
            continue
        if kind == "extra_forbidden":
            # Never its value: a misspelt key (``pasword=``) is as secret as the right one.
            unknown = True
            problems.append(f"{where}: unknown option")
            continue
        if msg[:1].isupper() and msg[1:2].islower():
            msg = msg[0].lower() + msg[1:]
        shown = _HIDDEN if secret else _shown(value)
        if secret or shown not in msg:
            msg = f"{msg} (given: {shown})"
        problems.append(f"{where}: {msg}")
    if unknown:
        known = [info.alias or name for name, info in model.model_fields.items()]
        problems.append(f"the options are: {', '.join(known)}")
    return "; ".join(problems)
