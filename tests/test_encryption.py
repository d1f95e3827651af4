"""The encryption codec and its keys, without a server: what a payload looks like sealed, and what is refused.

Runs with encryption end to end (the marker test, rotation, a worker missing a key) are in `test_encrypted_runs`.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from durable_codemode import (
    CodeModeRunWorkflow,
    CodeModeUserError,
    EncryptionCodec,
    EncryptionError,
    EncryptionKeyError,
    EncryptionKeys,
    data_converter,
)
from durable_codemode._encryption import ENCRYPTION_KEYS_ENV, KEY_ID_METADATA, resolve_encryption
from durable_codemode._history_fetch import histories_from_json
from durable_codemode.worker._worker import workflow_runner

HISTORIES = Path(__file__).parent / "histories"
MARKER = b"zebra-7431"


def keys(*ids: str) -> EncryptionKeys:
    return EncryptionKeys.parse(",".join(f"{i}:{EncryptionKeys.new_key()}" for i in ids))


def plain(data: bytes = b'"' + MARKER + b'"') -> Payload:
    return Payload(metadata={"encoding": b"json/plain", "note": b"kept"}, data=data)


def test_a_sealed_payload_names_its_key_hides_everything_and_opens_to_the_same_payload() -> None:
    codec = EncryptionCodec(keys("k1"))
    original = plain()
    sealed, again = codec.encrypt([original, original])
    assert dict(sealed.metadata) == {"encoding": b"binary/encrypted", KEY_ID_METADATA: b"k1"}
    assert MARKER not in sealed.SerializeToString() and b"kept" not in sealed.SerializeToString()
    assert sealed.data != again.data  # a fresh nonce per payload
    assert codec.decrypt([sealed, again]) == [original, original]  # data and the payload's own metadata
    # The overhead per payload: nonce, tag, and the outer metadata (reported in docs/operations.md).
    assert sealed.ByteSize() - original.ByteSize() <= 90


def test_plaintext_payloads_pass_through_decode() -> None:
    codec = EncryptionCodec(keys("k1"))
    original = plain()
    (decoded,) = codec.decrypt([original])
    assert decoded is original


def test_an_unknown_key_is_refused_by_name() -> None:
    (sealed,) = EncryptionCodec(keys("old")).encrypt([plain()])
    codec = EncryptionCodec(keys("new"), subject="run 'run-42'")
    with pytest.raises(EncryptionKeyError, match=r"payload \(run 'run-42'\) is encrypted with key 'old'.*holds 'new'.*"
                       rf"add key 'old' to {ENCRYPTION_KEYS_ENV}") as caught:
        codec.decrypt([sealed])
    assert caught.value.key_id == "old"


def test_altered_truncated_or_relabelled_ciphertext_is_refused() -> None:
    ring = keys("a", "b")
    codec = EncryptionCodec(ring)
    (sealed,) = codec.encrypt([plain()])
    flipped = Payload()
    flipped.CopyFrom(sealed)
    flipped.data = sealed.data[:-1] + bytes([sealed.data[-1] ^ 1])
    with pytest.raises(EncryptionError, match="does not decrypt with key 'a': its ciphertext was altered or truncated"):
        codec.decrypt([flipped])
    cut = Payload()
    cut.CopyFrom(sealed)
    cut.data = sealed.data[:20]
    with pytest.raises(EncryptionError, match="truncated"):
        codec.decrypt([cut])
    # The key id is authenticated: relabelled to another key this process holds, it does not open.
    relabelled = Payload()
    relabelled.CopyFrom(sealed)
    relabelled.metadata[KEY_ID_METADATA] = b"b"
    with pytest.raises(EncryptionError, match="does not decrypt with key 'b'"):
        codec.decrypt([relabelled])
    # Even under the same key material: the key id is the associated data.
    same = EncryptionKeys((("a", ring.keys[0][1]), ("c", ring.keys[0][1])))
    relabelled.metadata[KEY_ID_METADATA] = b"c"
    with pytest.raises(EncryptionError, match="does not decrypt with key 'c'"):
        EncryptionCodec(same).decrypt([relabelled])
    unnamed = Payload(metadata={"encoding": b"binary/encrypted"}, data=sealed.data)
    with pytest.raises(EncryptionError, match="names no key"):
        codec.decrypt([unnamed])


def test_the_first_key_encrypts_and_every_key_decrypts() -> None:
    a, b = keys("a"), keys("b")
    both = EncryptionKeys(b.keys + a.keys)
    (old,) = EncryptionCodec(a).encrypt([plain()])
    codec = EncryptionCodec(both)
    (new,) = codec.encrypt([plain()])
    assert new.metadata[KEY_ID_METADATA] == b"b"
    assert codec.decrypt([old, new]) == [plain(), plain()]


def test_keys_load_from_inline_entries_a_file_or_the_environment(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    k1, k2 = EncryptionKeys.new_entry("k1"), EncryptionKeys.new_entry("k2")
    assert EncryptionKeys.load(f"{k2},{k1}").ids == ("k2", "k1")
    file = tmp_path / "keys"
    file.write_text(f"# rotated 2026-12-08\n{k2}\n\n{k1}  # retired: keep while runs use it\n")
    assert EncryptionKeys.load(str(file)).ids == ("k2", "k1")
    assert EncryptionKeys.load(file).current == "k2"
    monkeypatch.setenv(ENCRYPTION_KEYS_ENV, str(file))
    assert resolve_encryption(None) == EncryptionKeys.load(file)
    assert resolve_encryption(False) is None
    monkeypatch.delenv(ENCRYPTION_KEYS_ENV)
    assert resolve_encryption(None) is None
    with pytest.raises(CodeModeUserError, match=f"encryption=True needs {ENCRYPTION_KEYS_ENV}"):
        resolve_encryption(True)
    assert "key" not in repr(EncryptionKeys.load(k1)).replace("EncryptionKeys", "")  # no key material in a repr


_FIXED_KEY = base64.b64encode(bytes(range(32))).decode()
"""A valid key that is the same in every test process: pytest-xdist requires the same parameters everywhere."""


@pytest.mark.parametrize(("setting", "problem"), [
    ("k1", "cannot read the encryption key file 'k1'"),
    ("k1:not base64!", "the key 'k1' is not base64"),
    ("k1:" + base64.b64encode(bytes(16)).decode(), "is 16 bytes; AES-256 needs 32"),
    ("bad id:" + _FIXED_KEY, "the encryption key id 'bad id' must be"),
    ("k1:" + _FIXED_KEY + ",k1:" + _FIXED_KEY, "'k1' is listed twice"),
    ("k1:" + _FIXED_KEY + ",oops", "the entry 'oops' is not `id:base64key`"),
])
def test_malformed_keys_are_refused_with_what_to_fix(setting: str, problem: str) -> None:
    with pytest.raises(CodeModeUserError, match=problem.replace("(", r"\(").replace("?", r"\?")):
        EncryptionKeys.load(setting)


@pytest.mark.parametrize("recorded", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.stem)
async def test_unencrypted_histories_replay_and_read_with_encryption_configured(recorded: Path) -> None:
    failures = []
    for converter in (data_converter(encryption=keys("k1")), data_converter()):
        replayer = Replayer(workflows=[CodeModeRunWorkflow], data_converter=converter,
                            workflow_runner=workflow_runner(), debug_mode=True)
        history = WorkflowHistory.from_json(recorded.stem, recorded.read_text())
        failures.append((await replayer.replay_workflow(history, raise_on_replay_failure=False)).replay_failure)
    # As without keys: a run of a supported behaviour version replays; one of 0.1.0 (`before_*`) is refused
    # (test_behavior_version); one whose approval rule must be known (`_rule`) replays where its agent was served
    # (test_deploy_changes), with or without keys alike.
    assert (failures[0] is None) == (failures[1] is None)
    if re.fullmatch(r"behavior_version_\d+", recorded.stem):
        assert failures == [None, None]
    (read,) = histories_from_json(recorded.read_text(), encryption=keys("k1"))
    assert read.events == history.events  # a plaintext file is read as it is
