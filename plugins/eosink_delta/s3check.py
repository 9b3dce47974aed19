"""A Delta commit on an object store is safe only with an atomic "create if absent".

Two writers that commit version N of a table at once must not both succeed: each writes
``_delta_log/<N>.json``, and a plain S3 PUT lets the second overwrite the first (a commit
lost without an error). delta-rs makes that PUT conditional (``If-None-Match: *``, which
Amazon S3 and most S3-compatible stores honour) unless told to use a DynamoDB lock
(``AWS_S3_LOCKING_PROVIDER``) or told that unsafe renames are fine
(``AWS_S3_ALLOW_UNSAFE_RENAME``). Some S3-compatible servers accept the header and ignore
it. So before the sink's first commit to a bucket, :func:`check_safe_commit` refuses the
unsafe setting and tries the condition once on the store itself.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any
from urllib.parse import urlsplit

from eosink import ConfigError

from .options import DeltaSinkOptions, redact

__all__ = ["check_safe_commit"]

_checked: set[tuple[str | None, str]] = set()
_lock = threading.Lock()


def check_safe_commit(opts: DeltaSinkOptions) -> None:
    """Refuse an S3 table whose commits would not be atomic (see the module docstring).

    Raises:
        ConfigError: unsafe renames allowed, or the store overwrote an object a conditional
            PUT should have refused.
    """
    if not opts.on_s3:
        return
    unsafe = opts.s3_setting("AWS_S3_ALLOW_UNSAFE_RENAME")
    if unsafe is not None and unsafe.lower() == "true":
        raise ConfigError(
            f"Delta table {opts.path}: AWS_S3_ALLOW_UNSAFE_RENAME=true lets two commits of one "
            "version both succeed (one is lost without an error). The delta sink refuses it: "
            "remove the setting (delta-rs then commits with a conditional PUT) or configure "
            "AWS_S3_LOCKING_PROVIDER=dynamodb"
        )
    if opts.s3_setting("AWS_S3_LOCKING_PROVIDER"):
        return
    endpoint = opts.s3_setting("AWS_ENDPOINT_URL", "AWS_ENDPOINT", "ENDPOINT_URL", "ENDPOINT")
    bucket = urlsplit(opts.path).netloc
    with _lock:
        if (endpoint, bucket) in _checked:
            return
        _probe(opts, endpoint, bucket)
        _checked.add((endpoint, bucket))


def _probe(opts: DeltaSinkOptions, endpoint: str | None, bucket: str) -> None:
    import boto3

    client: Any = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=opts.s3_setting("AWS_REGION", "REGION", "AWS_DEFAULT_REGION") or "us-east-1",
        aws_access_key_id=opts.s3_setting("AWS_ACCESS_KEY_ID", "ACCESS_KEY_ID"),
        aws_secret_access_key=opts.s3_setting("AWS_SECRET_ACCESS_KEY", "SECRET_ACCESS_KEY"),
        aws_session_token=opts.s3_setting("AWS_SESSION_TOKEN", "SESSION_TOKEN", "TOKEN"),
    )
    prefix = urlsplit(opts.path).path.strip("/")
    key = (
        f"{prefix}/_eosink/probe-{uuid.uuid4().hex}"
        if prefix
        else f"_eosink/probe-{uuid.uuid4().hex}"
    )
    try:
        client.put_object(Bucket=bucket, Key=key, Body=b"1", IfNoneMatch="*")
    except Exception as exc:
        raise ConfigError(
            redact(
                f"Delta table {opts.path}: cannot write to s3://{bucket} "
                f"({type(exc).__name__}: {exc}). Check storage_options (endpoint, region, "
                "credentials) and that the bucket exists",
                opts,
            )
        ) from None
    try:
        try:
            client.put_object(Bucket=bucket, Key=key, Body=b"2", IfNoneMatch="*")
        except Exception as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return  # refused, as it must be
            raise ConfigError(
                redact(
                    f"Delta table {opts.path}: checking that the store refuses a conditional "
                    f"PUT of an existing object failed: {type(exc).__name__}: {exc}",
                    opts,
                )
            ) from None
        raise ConfigError(
            f"Delta table {opts.path}: the S3 store at {endpoint or 'AWS'} overwrote an object "
            "that a conditional PUT (If-None-Match: *) must not overwrite, so two commits of "
            "one table version could both succeed (one lost without an error). Use a store "
            "that honours conditional writes, or AWS_S3_LOCKING_PROVIDER=dynamodb"
        )
    finally:
        try:
            client.delete_object(Bucket=bucket, Key=key)
        except Exception:
            pass
