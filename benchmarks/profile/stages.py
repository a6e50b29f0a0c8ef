"""µs per 1 KiB SEND_MESSAGE_V2 for each broker stage, in isolation (the ARCHITECTURE.md model).

Stages: frame decode (bytes → RemotingCommand), header parse (extFields → typed header, and the
send handler's fast path), store append + dispatch (put_message on a real store in a temporary
directory, no flush; and put_each of 256 single sends, what the send coalescer makes of one loop
turn of pipelined sends), response encode (response header → frame bytes; and the coalescer's
template, `encode_send_success`). Socket reads/writes and the event loop are not here;
benchmarks/profile/run.sh measures the whole broker's CPU per message.

Usage: python benchmarks/profile/stages.py
"""

from __future__ import annotations

import os
import tempfile
import timeit
from pathlib import Path

from tidemq.clock import SystemClock
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.frame import (
    FrameDecoder,
    RemotingCommand,
    encode,
    encode_parts,
    encode_send_success,
)
from tidemq.protocol.headers_send import SendMessageRequestHeader, SendMessageResponseHeader
from tidemq.protocol.message import encode_properties
from tidemq.protocol.message_id import offset_msg_id
from tidemq.store.config import StoreConfig
from tidemq.store.message_store import FileMessageStore
from tidemq.store.types import MessageToStore

COUNT = 20_000


def per_call_us(function: object, number: int = COUNT) -> float:
    return min(timeit.repeat(function, number=number, repeat=3)) / number * 1e6  # type: ignore[arg-type]


def main() -> None:
    body = os.urandom(1024)
    properties = encode_properties({"UNIQ_KEY": "7F000001000100000000000000000001", "WAIT": "true"})
    header = SendMessageRequestHeader(
        producer_group="PG",
        topic="ProfileTopic",
        queue_id=3,
        born_timestamp=1_700_000_000_000,
        properties=properties,
        broker_name="broker-a",
    )
    frame = encode(
        RemotingCommand(
            code=RequestCode.SEND_MESSAGE_V2,
            opaque=7,
            ext_fields=header.to_fields(v2=True),
            body=body,
        )
    )
    decoder = FrameDecoder()
    fields = header.to_fields(v2=True)
    results = {
        "frame decode": per_call_us(lambda: decoder.feed(frame)),
        "header parse": per_call_us(lambda: SendMessageRequestHeader.from_fields(fields)),
    }

    request = decoder.feed(frame)[0]

    def respond() -> None:
        msg_id = offset_msg_id("127.0.0.1", 10911, 123_456)
        response_fields = SendMessageResponseHeader(
            msg_id=msg_id, queue_id=3, queue_offset=99
        ).to_fields()
        encode_parts(request.response(0, response_fields))

    results["response encode"] = per_call_us(respond)
    # Since issue 12 the fast path is from_fields itself ("header parse"): kept for A/B.
    results["  send handler's header fast path"] = per_call_us(
        lambda: SendMessageRequestHeader.from_fields(fields)
    )
    results["  response from the template"] = per_call_us(
        lambda: encode_send_success(7, offset_msg_id("127.0.0.1", 10911, 123_456), 3, 99)
    )
    with tempfile.TemporaryDirectory(prefix="tidemq-stages-") as tmp:
        store = FileMessageStore(StoreConfig(root_dir=Path(tmp)), SystemClock())
        store.start()
        messages = iter(
            [
                MessageToStore(
                    topic="ProfileTopic",
                    queue_id=index % 8,
                    body=body,
                    flag=0,
                    properties=encode_properties(
                        {"UNIQ_KEY": f"7F0000010001{index:020X}", "CLUSTER": "C"}
                    ),
                    sys_flag=0,
                    born_timestamp=1_700_000_000_000,
                    born_host=("127.0.0.1", 40000),
                    store_host=("127.0.0.1", 10911),
                )
                for index in range(COUNT * 6)
            ]
        )
        results["store append + dispatch"] = per_call_us(lambda: store.put_message(next(messages)))
        group = 256
        results[f"  put_each of {group}, per message"] = (
            per_call_us(
                lambda: store.put_each([next(messages) for _ in range(group)]), COUNT // group
            )
            / group
        )
        store.shutdown()
    for name, micros in results.items():
        print(f"{name:<34} {micros:6.1f} µs")
    total = sum(micros for name, micros in results.items() if not name.startswith(" "))
    print(f"{'sum (first lines)':<34} {total:6.1f} µs")


if __name__ == "__main__":
    main()
