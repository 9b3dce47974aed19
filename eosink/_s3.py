"""S3 for sinks: the ``s3_*`` options, ``s3://`` URLs and boto3 clients (extra ``eosink[s3]``).

Shared by the sinks that read or write ``s3://bucket/prefix`` locations (the file sink's
output, the kafka sink's staging): one spelling of the options, one cached client per
endpoint and credentials in a process. boto3 is imported only when a client is made.
"""

from __future__ import annotations

import functools
import os
import re
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, SecretStr, field_validator

from .errors import MissingExtraError

__all__ = [
    "S3Options",
    "check_endpoint_url",
    "is_s3",
    "local_tmp_dir",
    "normalize_s3",
    "s3_client",
    "split_s3",
]

_S3_SCHEMES = ("s3://", "s3a://", "s3n://")


def is_s3(location: str) -> bool:
    """Whether ``location`` is an S3 URL (``s3://``, or Hadoop's ``s3a://`` / ``s3n://``)."""
    return location.startswith(_S3_SCHEMES)


def normalize_s3(location: str) -> str:
    """``s3a://b/x/`` (Hadoop's spelling, as in Spark checkpoint locations) -> ``s3://b/x``."""
    for scheme in _S3_SCHEMES:
        if location.startswith(scheme):
            return "s3://" + location[len(scheme) :].rstrip("/")
    return location


def split_s3(path: str) -> tuple[str, str]:
    """``s3://bucket/a/b/`` -> ``("bucket", "a/b")``."""
    rest = normalize_s3(path).removeprefix("s3://")
    bucket, _, prefix = rest.partition("/")
    return bucket, prefix.strip("/")


_HOST_LABELS = re.compile(r"^((?!-)[A-Z\d-]{1,63}(?<!-)\.)*((?!-)[A-Z\d-]{1,63}(?<!-))$", re.I)


def check_endpoint_url(value: str | None) -> str | None:
    """``s3_endpoint_url`` as botocore takes it: ``http(s)://host[:port][/path]``.

    Raises:
        ValueError: anything else, saying what an endpoint looks like (botocore would
            raise ``ValueError: Invalid endpoint`` when the first client is made, naming no
            option).
    """
    if value is None:
        return None
    v = value.strip()
    problem = None
    try:
        parts = urlsplit(v)
        host = parts.hostname or ""
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        parts, host, problem = None, "", "its port is not a number"
    if problem is None:
        if parts is None or parts.scheme.lower() not in ("http", "https"):
            problem = "it does not start with http:// or https://"
        elif any(c.isspace() for c in v):
            problem = "it contains spaces"
        elif not host:
            problem = "it names no host"
        elif ":" not in host and not _HOST_LABELS.match(host.rstrip(".")):
            problem = f"{host!r} is not a host name"
    if problem is not None:
        raise ValueError(
            f"not an S3 endpoint URL ({problem}); give the endpoint as "
            "http(s)://host[:port], e.g. https://s3.eu-west-1.amazonaws.com or "
            "http://127.0.0.1:9000"
        )
    return v


class S3Options(BaseModel):
    """The ``s3_*`` options of a sink that reads or writes ``s3://`` locations.

    Attributes:
        s3_endpoint_url: the S3 endpoint (default: AWS's).
        s3_region: the region (default: boto3's configuration).
        s3_access_key_id: the access key (default: boto3's credential chain).
        s3_secret_access_key: the secret key; never logged or stored.
        s3_session_token: a session token; never logged or stored.
    """

    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_access_key_id: str | None = Field(default=None, repr=False)
    s3_secret_access_key: SecretStr | None = None
    s3_session_token: SecretStr | None = None

    @field_validator("s3_endpoint_url")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        return check_endpoint_url(v)

    def s3_args(self) -> tuple[str | None, str | None, str | None, str | None, str | None]:
        """``(endpoint, region, key, secret, token)``: the arguments of :func:`s3_client`."""
        return (
            self.s3_endpoint_url,
            self.s3_region,
            self.s3_access_key_id,
            self.s3_secret_access_key.get_secret_value() if self.s3_secret_access_key else None,
            self.s3_session_token.get_secret_value() if self.s3_session_token else None,
        )

    def s3_options_set(self) -> list[str]:
        """The names of the ``s3_*`` options given (to refuse them where they do not apply)."""
        return [k for k in S3Options.model_fields if getattr(self, k) is not None]


def s3_client(
    endpoint: str | None,
    region: str | None,
    key: str | None,
    secret: str | None,
    token: str | None,
    what: str = "s3:// locations",
) -> Any:
    """A boto3 S3 client (cached per process and arguments; boto3 clients are thread-safe).

    Raises:
        MissingExtraError: boto3 is not installed (names ``pip install 'eosink[s3]'`` and
            ``what`` needs it).
    """
    try:
        import boto3  # noqa: F401
    except ImportError as exc:  # pragma: no cover - exercised without the extra
        raise MissingExtraError("boto3", "s3", what) from exc
    return _client(endpoint, region, key, secret, token)


@functools.lru_cache(maxsize=16)
def _client(
    endpoint: str | None, region: str | None, key: str | None, secret: str | None, token: str | None
) -> Any:
    return new_s3_client(
        (endpoint, region, key, secret, token),
        retries={"max_attempts": 5, "mode": "standard"},
        max_pool_connections=32,
    )


def new_s3_client(
    args: tuple[str | None, str | None, str | None, str | None, str | None], **config: Any
) -> Any:
    """A new (uncached) boto3 S3 client for ``(endpoint, region, key, secret, token)`` with
    botocore ``Config(**config)``; boto3 must be importable (see :func:`s3_client`)."""
    import boto3
    from botocore.config import Config

    endpoint, region, key, secret, token = args
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        aws_session_token=token,
        config=Config(**config),
    )


def local_tmp_dir() -> Path:
    """A private local directory for files on their way to S3 (``$EOSINK_TMPDIR``, else the
    system's temporary directory)."""
    base = os.environ.get("EOSINK_TMPDIR") or None
    return Path(tempfile.mkdtemp(prefix="eosink-s3-", dir=base))
