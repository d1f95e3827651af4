"""Temporal's OpenTelemetry interceptor, imported only when tracing is on (the SDK is an optional install)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .shared._errors import CodeModeUserError

__all__ = ["client_interceptors", "has_tracing_interceptor", "otel_interceptor_type"]

_SDK_MISSING = ("tracing needs the OpenTelemetry SDK and Temporal's OpenTelemetry support: "
                "`pip install opentelemetry-sdk` (and an exporter), then set the tracer provider as shown in "
                "docs/observability.md")


def otel_interceptor_type() -> type[Any]:
    try:
        from temporalio.contrib.opentelemetry import OpenTelemetryInterceptor
    except ImportError as e:
        raise CodeModeUserError(_SDK_MISSING) from e
    return OpenTelemetryInterceptor


def has_tracing_interceptor(interceptors: Sequence[Any]) -> bool:
    """Whether Temporal's OpenTelemetry interceptor is among `interceptors` (without importing it if it can't be)."""
    return any(type(i).__name__ == "OpenTelemetryInterceptor" for i in interceptors)


def client_interceptors() -> list[Any]:
    """The interceptors a tracing client needs: Temporal's, which puts the caller's span into the run's header."""
    return [otel_interceptor_type()()]

