"""Drives the official RocketMQ C++ client (PyPI `rocketmq==0.4.4`) in a process of its own.

The compat tests never load librocketmq into the pytest process: a crash, a hang in a native
thread or state left behind by one scenario (the library keeps per-process client factories)
would otherwise take the whole run with it. Each role runs here instead and talks to the test
over pipes, one JSON object per line:

    producer:  stdin  {"op": "send", "id": 7, "mode": "sync"|"async"|"oneway"|"orderly",
                       "topic": T, "body": B, "tags": t?, "keys": k?, "arg": n?}
                      {"op": "batch", "id": 8, "topic": T, "messages": [{"body", "tags", "keys"}]}
                      {"op": "stop"}
               stdout {"event": "ready"} once started,
                      {"event": "sent", "id": 7, "status": 0, "msg_id": ..., "offset": ...}
                      {"event": "error", "id": 7, "error": "..."}, {"event": "stopped"}
    push:      stdout {"event": "ready"}, then {"event": "received", "body": ..., "tags": ...,
                      "queue_id": ..., "queue_offset": ..., ...} per callback; "stop" (or EOF)
                      on stdin shuts the consumer down cleanly, then {"event": "stopped"};
               with --fail-once the listener raises (RECONSUME_LATER) for every message whose
               reconsume_times is 0, after reporting it with "failed": true
    pull:      pulls every queue from offset 0 (the binding keeps offsets in Python memory)
               until --expect messages arrived or --timeout-s passed; one "received" event per
               message, then {"event": "done", "count": n}

Async send results arrive on librocketmq's threads, so every write goes through one lock.
The process leaves with os._exit after "stopped": the binding's __del__ would shut the client
down a second time during interpreter teardown, which is not what is under test.

Run with HOME pointing at a scratch directory: librocketmq writes ~/logs/rocketmq-cpp and keeps
broadcasting offsets under ~/.rocketmq_offsets.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

from rocketmq.client import Message, Producer, PullConsumer, PushConsumer, RecvMessage
from rocketmq.ffi import MessageModel

PULL_IDLE_POLL_S = 0.2  # Pause between full passes over the queues while waiting for more.

_write_lock = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, **fields})
    with _write_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def text(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


def describe(msg: RecvMessage) -> dict[str, Any]:
    return {
        "topic": msg.topic,
        "body": text(msg.body),
        "tags": text(msg.tags),
        "keys": text(msg.keys),
        "msg_id": msg.id,
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "reconsume_times": msg.reconsume_times,
        "retry_topic": text(msg.get_property("RETRY_TOPIC")),
        "thread": threading.get_ident(),
    }


def build_message(topic: str, spec: dict[str, Any]) -> Message:
    msg = Message(topic)
    msg.set_body(spec["body"])
    if spec.get("tags"):
        msg.set_tags(spec["tags"])
    if spec.get("keys"):
        msg.set_keys(spec["keys"])
    return msg


def result_fields(result: Any) -> dict[str, Any]:
    return {"status": int(result.status), "msg_id": result.msg_id, "offset": result.offset}


def set_credentials(client: Any, args: argparse.Namespace) -> None:
    """--access-key/--secret-key: the client signs every request (ACL), channel "LOCAL"."""
    if args.access_key:
        client.set_session_credentials(args.access_key, args.secret_key, "LOCAL")


def run_producer(args: argparse.Namespace) -> None:
    producer = Producer(args.group, timeout=args.send_timeout_ms)
    producer.set_namesrv_addr(args.namesrv)
    set_credentials(producer, args)
    producer.start()
    emit("ready")
    # Async sends: the message objects must outlive the call until their callback has fired.
    in_flight: dict[int, Message] = {}
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        if op == "stop":
            break
        command_id = command["id"]
        try:
            if op == "batch":
                msgs = [build_message(command["topic"], spec) for spec in command["messages"]]
                emit("sent", id=command_id, **result_fields(producer.send_batch(msgs)))
                continue
            msg = build_message(command["topic"], command)
            mode = command["mode"]
            if mode == "sync":
                emit("sent", id=command_id, **result_fields(producer.send_sync(msg)))
            elif mode == "orderly":
                result = producer.send_orderly(msg, int(command["arg"]))
                emit("sent", id=command_id, **result_fields(result))
            elif mode == "oneway":
                producer.send_oneway(msg)
                emit("sent", id=command_id, status=None, msg_id=None, offset=None)
            elif mode == "async":
                in_flight[command_id] = msg

                def on_success(result: Any, command_id: int = command_id) -> None:
                    in_flight.pop(command_id, None)
                    emit("sent", id=command_id, **result_fields(result))

                def on_error(exc: Exception, command_id: int = command_id) -> None:
                    in_flight.pop(command_id, None)
                    emit("error", id=command_id, error=repr(exc))

                producer.send_async(msg, on_success, on_error)
            else:
                emit("error", id=command_id, error=f"unknown mode {mode!r}")
        except Exception as exc:  # Reported to the test, which decides.
            emit("error", id=command_id, error=repr(exc))
    producer.shutdown()
    emit("stopped")


def run_push(args: argparse.Namespace) -> None:
    model = MessageModel.BROADCASTING if args.model == "broadcasting" else MessageModel.CLUSTERING
    consumer = PushConsumer(args.group, orderly=args.orderly, message_model=model)
    consumer.set_namesrv_addr(args.namesrv)
    set_credentials(consumer, args)
    if args.thread_count:
        consumer.set_thread_count(args.thread_count)

    def on_message(msg: RecvMessage) -> None:
        fail = args.fail_once and msg.reconsume_times == 0
        emit("received", failed=fail, **describe(msg))
        if fail:
            raise RuntimeError("fail-once: first delivery refused")  # the binding: RECONSUME_LATER

    consumer.subscribe(args.topic, on_message, args.expr)
    consumer.start()
    emit("ready")
    for line in sys.stdin:
        if line.strip() == "stop":
            break
    consumer.shutdown()
    emit("stopped")


def run_pull(args: argparse.Namespace) -> None:
    consumer = PullConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    set_credentials(consumer, args)
    consumer.start()
    emit("ready")
    count = 0
    deadline = time.monotonic() + args.timeout_s
    while True:
        for msg in consumer.pull(args.topic, args.expr, args.max_num):
            emit("received", **describe(msg))
            count += 1
        if count >= args.expect or time.monotonic() > deadline:
            break
        time.sleep(PULL_IDLE_POLL_S)
    consumer.shutdown()
    emit("done", count=count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)
    producer = sub.add_parser("producer")
    producer.add_argument("--namesrv", required=True)
    producer.add_argument("--group", required=True)
    producer.add_argument("--send-timeout-ms", type=int, default=5000)
    push = sub.add_parser("push")
    push.add_argument("--namesrv", required=True)
    push.add_argument("--group", required=True)
    push.add_argument("--topic", required=True)
    push.add_argument("--expr", default="*")
    push.add_argument("--model", choices=["clustering", "broadcasting"], default="clustering")
    push.add_argument("--orderly", action="store_true")
    push.add_argument("--thread-count", type=int, default=0)
    push.add_argument("--fail-once", action="store_true")
    pull = sub.add_parser("pull")
    pull.add_argument("--namesrv", required=True)
    pull.add_argument("--group", required=True)
    pull.add_argument("--topic", required=True)
    pull.add_argument("--expr", default="*")
    pull.add_argument("--expect", type=int, required=True)
    pull.add_argument("--timeout-s", type=float, default=20.0)
    pull.add_argument("--max-num", type=int, default=32)
    for role in (producer, push, pull):
        role.add_argument("--access-key", default=None)
        role.add_argument("--secret-key", default=None)
    args = parser.parse_args()
    try:
        {"producer": run_producer, "push": run_push, "pull": run_pull}[args.role](args)
    except Exception as exc:
        emit("fatal", error=repr(exc))
        sys.stdout.flush()
        os._exit(2)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
