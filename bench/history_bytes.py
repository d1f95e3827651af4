"""Where a nested call's history bytes go: one code-mode run and one floor run, broken down field by field.

`python bench/history_bytes.py [--n 200] [--kind gather sequential]` starts a dev server in memory, runs
`run_bench.py`'s scenario once on each side (code mode and the floor), fetches both histories and prints, per
nested call, the serialized protobuf bytes of each part of each tool activity's events (scheduled, started,
completed), the per-call share of the run's result (the `CallRecord`s) and of everything else, on both sides,
and the difference. A field's bytes are what the event shrinks by when the field is cleared (its tag and length
included), so the rows of one event add up to the event's size. See `bench/README.md` for the table it gives.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.floor`, `bench.run_bench`

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import History, HistoryEvent
from temporalio.client import WorkflowHistory
from temporalio.worker import Worker

from bench.floor import FLOOR_ACTIVITIES, FloorWorkflow
from bench.run_bench import CODEMODE_QUEUE, FLOOR_QUEUE, Bench, Kind, machine, make_agent, run_and_exit
from durable_codemode import create_worker, start_dev_server
from durable_codemode.worker._pool import shutdown_pool
from durable_codemode.worker._worker import workflow_runner

_ATTRIBUTES = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: "activity_task_scheduled_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED: "activity_task_started_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "activity_task_completed_event_attributes",
}
_SHORT = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: "scheduled",
    EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED: "started",
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "completed",
}
# Payload fields worth their own row: what the data converter wrote, and its metadata.
_PAYLOADS = {"input", "result"}


def _without(event: HistoryEvent, path: Sequence[str]) -> int:
    """The event's size with the field at `path` cleared."""
    copy = HistoryEvent()
    copy.CopyFrom(event)
    message = copy
    for name in path[:-1]:
        message = getattr(message, name)
    message.ClearField(path[-1])
    return copy.ByteSize()


def _parts(event: HistoryEvent) -> dict[str, int]:
    """The event's bytes by field: `event.<field>` for the envelope, `<attribute field>` for the attributes."""
    total = event.ByteSize()
    attrs_name = _ATTRIBUTES[event.event_type]
    attrs = getattr(event, attrs_name)
    parts: dict[str, int] = {}
    for field, _ in event.ListFields():
        if field.name == attrs_name:
            continue
        if field.name == "user_metadata":
            for sub, _ in event.user_metadata.ListFields():
                parts[f"user_metadata.{sub.name}"] = total - _without(event, ["user_metadata", sub.name])
            parts["user_metadata (wrapper)"] = (total - _without(event, ["user_metadata"])
                                                - sum(v for k, v in parts.items() if k.startswith("user_metadata.")))
            continue
        parts[f"event.{field.name}"] = total - _without(event, [field.name])
    for field, _ in attrs.ListFields():
        size = total - _without(event, [attrs_name, field.name])
        if field.name in _PAYLOADS:
            payloads = getattr(attrs, field.name).payloads
            data = sum(len(p.data) for p in payloads)
            parts[f"{field.name}: data"] = data
            parts[f"{field.name}: metadata, framing"] = size - data
        else:
            parts[field.name] = size
    parts["(attributes framing)"] = total - sum(parts.values())
    return parts


def breakdown(history: WorkflowHistory, activity_type: str, n: int) -> tuple[dict[str, float], dict[str, str]]:
    """Bytes per nested call by (event, field), plus the rest of the history; and an example value of each field."""
    rows: dict[str, float] = defaultdict(float)
    examples: dict[str, str] = {}
    scheduled: set[int] = set()
    for event in history.events:
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if event.activity_task_scheduled_event_attributes.activity_type.name != activity_type:
                continue
            scheduled.add(event.event_id)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            if event.activity_task_started_event_attributes.scheduled_event_id not in scheduled:
                continue
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            if event.activity_task_completed_event_attributes.scheduled_event_id not in scheduled:
                continue
        else:
            continue
        for part, size in _parts(event).items():
            key = f"{_SHORT[kind]} | {part}"
            rows[key] += size / n
            if key not in examples:
                examples[key] = _example(event, kind, part)
    whole = History(events=list(history.events)).ByteSize()
    calls = sum(rows.values()) * n
    result = _result_calls_bytes(history)
    if result is not None:
        rows["run result | CallRecord JSON"] = result / n
        examples["run result | CallRecord JSON"] = _first_call_record(history) or ""
    rest = whole - calls - (result or 0)
    rows["rest of the history / N (the other events: spec, model turns, workflow tasks)"] = rest / n
    rows["total / N"] = whole / n
    return dict(rows), examples


def _example(event: HistoryEvent, kind: int, part: str) -> str:
    attrs = getattr(event, _ATTRIBUTES[kind])
    if part == "activity_id":
        return attrs.activity_id
    if part == "activity_type":
        return attrs.activity_type.name
    if part.startswith("input: data"):
        return attrs.input.payloads[0].data.decode(errors="replace")
    if part.startswith("result: data"):
        return attrs.result.payloads[0].data.decode(errors="replace")
    if part.startswith("input: metadata") or part.startswith("result: metadata"):
        payload = (attrs.input if part.startswith("input") else attrs.result).payloads[0]
        return json.dumps({k: v.decode() for k, v in payload.metadata.items()})
    if part == "user_metadata.summary":
        return event.user_metadata.summary.data.decode(errors="replace")
    return ""


def _completion(history: WorkflowHistory) -> bytes | None:
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            payloads = event.workflow_execution_completed_event_attributes.result.payloads
            return payloads[0].data if payloads else None
    return None


def _calls_of(result: object) -> list[object]:
    if not isinstance(result, dict):
        return []
    return [c for t in result.get("turns", []) for s in t.get("snippets", []) for c in s.get("calls", [])]


def _result_calls_bytes(history: WorkflowHistory) -> int | None:
    """The bytes the run's result spends on its nested calls' records (the JSON of each, plus its comma)."""
    data = _completion(history)
    if data is None:
        return None
    calls = _calls_of(json.loads(data))
    if not calls:
        return None
    # Measured as the result shrinks when the records go, so the encoding is the converter's own.
    whole = json.loads(data)
    for turn in whole.get("turns", []):
        for snip in turn.get("snippets", []):
            snip["calls"] = []
    compact = json.dumps(whole, separators=(",", ":"))
    return len(json.dumps(json.loads(data), separators=(",", ":"))) - len(compact)


def _first_call_record(history: WorkflowHistory) -> str | None:
    data = _completion(history)
    calls = _calls_of(json.loads(data)) if data else []
    return json.dumps(calls[0], separators=(",", ":")) if calls else None


def table(kind: Kind, n: int, cm: tuple[dict[str, float], dict[str, str]],
          floor: tuple[dict[str, float], dict[str, str]], *, every_field: bool = False) -> str:
    """One markdown table: each part's bytes per call on both sides, the difference, and code mode's example.

    Parts within half a byte of the floor's are summed into one row unless `every_field`.
    """
    keys = list(dict.fromkeys([*cm[0], *floor[0]]))
    tail = [k for k in keys if k.startswith(("rest of", "total"))]
    keys = [k for k in keys if k not in tail]
    lines = [f"{kind}-{n}: bytes per nested call",
             "part of a call | code mode | floor | code mode - floor | code mode's value",
             "---|---:|---:|---:|---"]
    same_cm = same_floor = 0.0

    def row(key: str, a: float, b: float, example: str = "") -> str:
        if len(example) > 90:
            example = example[:87] + "..."
        return f"{key} | {a:.1f} | {b:.1f} | {a - b:+.1f} | {f'`{example}`' if example else ''}"

    for key in keys:
        a, b = cm[0].get(key, 0.0), floor[0].get(key, 0.0)
        if not every_field and abs(a - b) < 0.5:
            same_cm, same_floor = same_cm + a, same_floor + b
            continue
        lines.append(row(key, a, b, cm[1].get(key, "")))
    if not every_field:
        lines.append(row("every other field of the three events (the same on both sides)", same_cm, same_floor))
    lines.extend(row(key, cm[0].get(key, 0.0), floor[0].get(key, 0.0)) for key in tail)
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    kinds: list[Kind] = args.kind
    print(machine(), flush=True)
    agents = [make_agent(k, args.n) for k in kinds]
    env = await start_dev_server(banner="off")
    try:
        client = env.client
        cm_worker = create_worker(client, agents, task_queue=CODEMODE_QUEUE)
        floor_worker = Worker(client, task_queue=FLOOR_QUEUE, workflows=[FloorWorkflow],
                              activities=FLOOR_ACTIVITIES, workflow_runner=workflow_runner())
        async with cm_worker, floor_worker:
            bench = Bench(client)
            for kind in kinds:
                _, cm_history = await bench.run_codemode(kind, args.n)
                _, floor_history = await bench.run_floor(kind, args.n)
                if args.dump:
                    Path(f"{args.dump}-{kind}-{args.n}-cm.json").write_text(cm_history.to_json())
                    Path(f"{args.dump}-{kind}-{args.n}-floor.json").write_text(floor_history.to_json())
                cm = breakdown(cm_history, f"bench-{kind}-{args.n}.get", args.n)
                floor = breakdown(floor_history, "bench.floor_get", args.n)
                print(table(kind, args.n, cm, floor, every_field=args.every_field) + "\n", flush=True)
    finally:
        await env.shutdown()
        shutdown_pool()
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=200, help="nested calls per run")
    parser.add_argument("--kind", nargs="+", choices=["gather", "sequential"], default=["gather", "sequential"])
    parser.add_argument("--dump", metavar="PREFIX", help="also write both histories as JSON files")
    parser.add_argument("--every-field", action="store_true", help="a row for every field, not only those that differ")
    args = parser.parse_args(argv)
    run_and_exit(run(args))


if __name__ == "__main__":
    main()
