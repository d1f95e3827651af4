"""Every payload of a recorded history, found and decoded in place: what the debugging tools read.

Temporal's `Replayer` decodes a history's payloads itself, but our readers (`codemode trace`, `watch`, `audit`, the
replay reports, the deploy check) take payloads straight from the events. `decode_history` runs the client's
codec over every payload of a history once, where it is fetched or read, so everything after sees plaintext. A
failure whose message and stack trace were moved into its encoded attributes (Temporal's failure converter does
that when encryption is on) gets them back, so failure texts read as in an unencrypted run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, cast

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory
from temporalio.converter import PayloadCodec, WithSerializationContext, WorkflowSerializationContext

from ._encryption import KEY_ID_METADATA, is_encrypted

__all__ = ["decode_events", "decode_history", "decrypt_events", "encrypted_key_ids", "for_run",
           "payload_fields"]


def _messages(message: Message) -> Iterator[Message]:
    """Every message directly inside `message` (repeated and map fields included)."""
    for field, value in message.ListFields():
        if field.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        if isinstance(value, Message):
            items: Iterable[Any] = (value,)
        elif hasattr(value, "values"):  # a map field
            items = [v for v in value.values() if isinstance(v, Message)]
        else:  # a repeated field
            items = value
        yield from items


def payload_fields(message: Message) -> Iterator[Payload]:
    """Every `Payload` inside a protobuf message, at any depth (repeated and map fields included)."""
    for item in _messages(message):
        if isinstance(item, Payload):
            yield item
        else:
            yield from payload_fields(item)


def _failures(message: Message) -> Iterator[Failure]:
    for item in _messages(message):
        if isinstance(item, Failure):
            yield item
        if not isinstance(item, Payload):
            yield from _failures(item)


def _restore_failure_text(failure: Failure) -> None:
    """Put a decoded failure's message and stack trace back where readers look (`message`, `stack_trace`)."""
    attributes = failure.encoded_attributes
    if attributes.metadata.get("encoding") != b"json/plain":
        return  # still encoded (no key for it), or not the failure converter's
    try:
        decoded = json.loads(attributes.data)
    except ValueError:
        return
    if isinstance(decoded, dict):
        failure.message = str(decoded.get("message") or "")
        failure.stack_trace = str(decoded.get("stack_trace") or "")
        failure.ClearField("encoded_attributes")


def _apply(event: HistoryEvent, payloads: Sequence[Payload], decoded: Sequence[Payload]) -> None:
    for payload, plain in zip(payloads, decoded, strict=True):
        if plain is not payload:
            payload.CopyFrom(plain)
    for failure in _failures(event):
        if failure.HasField("encoded_attributes"):
            _restore_failure_text(failure)


async def decode_events(events: Sequence[HistoryEvent], codec: PayloadCodec | None) -> None:
    """Decode every payload of `events` with `codec`, in place (`None`: nothing to do).

    Raises:
        Whatever the codec raises for a payload it cannot decode (ours: `EncryptionKeyError`, naming the key).

    """
    if codec is None:
        return
    for event in events:
        payloads = list(payload_fields(event))
        if payloads:
            _apply(event, payloads, await codec.decode(payloads))


def decrypt_events(events: Sequence[HistoryEvent], decrypt: Callable[[list[Payload]], list[Payload]]) -> None:
    """`decode_events` with a synchronous decoder (`EncryptionCodec.decrypt`), for a history read from a file."""
    for event in events:
        payloads = list(payload_fields(event))
        if payloads:
            _apply(event, payloads, decrypt(payloads))


def for_run(codec: PayloadCodec | None, namespace: str, workflow_id: str) -> PayloadCodec | None:
    """`codec` told which run its payloads belong to (ours then names the run in its errors)."""
    if isinstance(codec, WithSerializationContext):
        return cast(PayloadCodec, codec.with_context(WorkflowSerializationContext(namespace=namespace,
                                                                                  workflow_id=workflow_id)))
    return codec


async def decode_history(history: WorkflowHistory, codec: PayloadCodec | None, *, namespace: str = "default"
                         ) -> WorkflowHistory:
    """`history` with every payload decoded by `codec`, in place (returns it); `None`: as it is."""
    await decode_events(history.events, for_run(codec, namespace, history.workflow_id))
    return history


def encrypted_key_ids(history: WorkflowHistory) -> set[str]:
    """The ids of the keys the encrypted payloads of `history` were written with (empty: none is encrypted)."""
    return {p.metadata.get(KEY_ID_METADATA, b"?").decode(errors="replace")
            for event in history.events for p in payload_fields(event) if is_encrypted(p)}
