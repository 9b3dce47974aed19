"""The epoch spec: how an epoch was staged (its Arrow schema and the sink's options, without
secrets), persisted by the core with every committable and handed back to the plugin's
``commit`` and ``abort`` (part of the plugin contract; public as ``eosink.EpochSpec``)."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pydantic import BaseModel

from .errors import SchemaOutdatedError
from .util import is_secret_name, redact

SPEC_VERSION = 1
"""The version of the spec's stored form this eosink writes (and reads up to)."""


@dataclass(frozen=True)
class EpochSpec:
    """How an epoch was staged: what a PENDING epoch is committed with, whatever options the
    run that finishes it was given (its recovery may run days later, with changed options).

    The core builds it in phase 1, from the sink's validated options and the epoch's Arrow
    schema (what ``writer_setup`` got), persists it beside the committable (the meta store's
    row and the journals' entries) and hands it back to ``commit`` and ``abort`` of a sink
    that declares ``Capabilities(epoch_spec=True)``.

    Contract:
        * Never secrets: an option declared ``SecretStr`` / ``SecretBytes`` or with
            ``Field(repr=False)``, a key named like a credential (``password``, ``token``,
            ``sasl.password``...) inside a mapping option, and a string holding a URL with a
            password are left out. A PENDING epoch is committed with the credentials of the
            run that finishes it (the coordinator's own options).
        * ``options`` is the options model's JSON form (``model_dump(mode="json")``): field
            names as keys, tuples as lists, paths as strings.

    Attributes:
        options: the options the epoch was staged with (JSON form, without secrets).
        schema: the epoch's Arrow schema, or None when the front end had none to give.
    """

    options: Mapping[str, Any] = field(default_factory=dict)
    schema: pa.Schema | None = None

    def encode(self) -> str:
        """The stored form: compact JSON with the version, options and schema."""
        schema = None
        if self.schema is not None:
            schema = base64.b64encode(schema_bytes(self.schema)).decode()
        return json.dumps(
            {"v": SPEC_VERSION, "options": dict(self.options), "schema": schema},
            separators=(",", ":"),
            sort_keys=True,
        )

    @staticmethod
    def decode(text: str, what: str = "an epoch") -> EpochSpec:
        """Rebuild a spec from :meth:`encode`'s text (any version up to this eosink's).

        Raises:
            SchemaOutdatedError: a newer eosink wrote it (after a downgrade); ``what`` names
                the epoch in the message.
        """
        data = json.loads(text)
        version = int(data.get("v", 1))
        if version > SPEC_VERSION:
            raise SchemaOutdatedError(
                f"{what} was staged by a newer eosink: its epoch spec has version {version}, "
                f"and this eosink reads up to version {SPEC_VERSION}. Nothing of it was "
                "changed. Run the job with the eosink version that staged it, which finishes "
                "the epoch; downgrade only after that"
            )
        schema = data.get("schema")
        return EpochSpec(
            options=dict(data.get("options") or {}),
            schema=None if schema is None else schema_from_bytes(base64.b64decode(schema)),
        )


def schema_bytes(schema: pa.Schema) -> bytes:
    """``schema`` as an Arrow IPC stream with no batches."""
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, schema):
        pass
    return sink.getvalue()


def schema_from_bytes(data: bytes) -> pa.Schema:
    """The schema :func:`schema_bytes` wrote."""
    return pa.ipc.open_stream(data).schema


def persisted_options(options: BaseModel | Mapping[str, Any]) -> dict[str, Any]:
    """``options`` in JSON form without anything that may be a secret (see
    :class:`EpochSpec`): a sink's options model, or a plain mapping (whose keys are judged by
    their names, and whose values that JSON cannot hold are written as strings)."""
    if isinstance(options, BaseModel):
        return _without_secrets(type(options), options.model_dump(mode="json"))
    plain = json.loads(json.dumps(dict(options), default=str))
    return _without_secrets(None, plain)


def _without_secrets(model: type[BaseModel] | None, value: dict[str, Any]) -> dict[str, Any]:
    from ._option_errors import _is_secret_type, _nested_model

    out: dict[str, Any] = {}
    fields = model.model_fields if model is not None else {}
    for key, v in value.items():
        info = fields.get(key)
        if info is not None:
            if not info.repr or _is_secret_type(info.annotation):
                continue
            nested = _nested_model(info.annotation)
        else:
            if is_secret_name(str(key)):
                continue  # a free-form mapping's key (no declared type): judged by its name
            nested = None
        kept = _kept(nested, v)
        if kept is not _DROP:
            out[key] = kept
    return out


_DROP = object()


def _kept(model: type[BaseModel] | None, value: Any) -> Any:
    if isinstance(value, dict):
        return _without_secrets(model, value)
    if isinstance(value, list):
        items = [_kept(model, v) for v in value]
        return [v for v in items if v is not _DROP]
    if isinstance(value, str) and "://" in value and redact(value) != value:
        return _DROP  # a URL with a password
    return value
