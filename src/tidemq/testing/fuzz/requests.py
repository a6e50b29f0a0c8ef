"""Mutated requests of a served code, for the network fuzz test (tests/fuzz/test_network_fuzz.py).

Seeded (`random.Random`), not Hypothesis: a live server is not reset between examples, so there
is nothing to shrink, and a seed replays the whole sequence. Every served code gets each variant:

    plausible      VALID_FIELDS (every name any typed header reads, with values every header
                   parses), three of them dropped or changed: gets past each handler's parse
    one_weird      VALID_FIELDS with one value weird
    garbage        random names and random text
    wrong_types    a JSON header whose extFields values are numbers, booleans, arrays, objects
    missing        no extFields at all
    weird          the plausible names with weird values (strategies.WEIRD_FIELD_VALUES)
    huge           one plausible value of HUGE_VALUE_BYTES
    bad_body       plausible fields and a body that is none of the ones the code expects
    binary         the plausible request in RocketMQ's binary header serialisation

and `malformed` gives byte-mutated frames of the same requests (mutations.apply), which may
leave the stream unusable, so they go on connections of their own.

Names are kept away from what the test stores and checks: no value here names its topic, its
group, the broker or the cluster, so a DELETE_TOPIC or WIPE_WRITE_PERM among the requests
refuses or acts on fuzz names only.
"""

from __future__ import annotations

import random
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import orjson

from tidemq.errors import ProtocolError
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.frame import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    RemotingCommand,
    SerializeType,
    decode_frame,
    encode,
)
from tidemq.protocol.headers import EndTransactionRequestHeader
from tidemq.protocol.message import BatchItem, encode_batch
from tidemq.security.signing import SIGNATURE, Credentials, sign
from tidemq.testing.fuzz.mutations import (
    BadUtf8,
    Delete,
    Flip,
    Insert,
    IntField,
    Mutation,
    Sample,
    Truncate,
    apply,
)
from tidemq.testing.fuzz.strategies import WEIRD_FIELD_VALUES, frame_fields
from tidemq.testing.fuzz.targets import HEADER_CLASSES, WIRE_NAMES

HUGE_VALUE_BYTES: Final = 70_000
FUZZ_TOPICS: Final = ("FuzzTopic", "FuzzTopic2", "%RETRY%FuzzGroup", "", "bad topic!", "x" * 300)
FUZZ_GROUPS: Final = ("FuzzGroup", "", "bad group!", "CID_RMQ_SYS_FUZZ")
FUZZ_BROKERS: Final = ("FuzzBroker", "127.0.0.1:1", "", "FuzzCluster", "[::1]:0")
NUMBERS: Final = ("0", "1", "-1", "3", "16", "2147483647", "9223372036854775807", "1000")
_TOPIC_KEYS: Final = frozenset({"topic", "b", "defaultTopic", "c", "originTopic"})
_GROUP_KEYS: Final = frozenset({"consumerGroup", "producerGroup", "a", "group"})
_BROKER_KEYS: Final = frozenset(
    {"brokerName", "bname", "n", "brokerAddr", "clusterName", "cluster", "masterAddr"}
    | {"haServerAddr"}
)
_TEXT_VALUES: Final = {
    "properties": ("TAGS\x01t\x02KEYS\x01k1 k2\x02", "a\x01b", "\x01\x02\x01"),
    "subscription": ("*", "TagA || TagB", "a > 1 AND b IS NULL", "((((", ""),
    "expressionType": ("TAG", "SQL92", "REGEX", ""),
    "msgId": ("0" * 32, "7F00000100002A9F0000000000000000", "ZZ"),
    "offsetMsgId": ("7F00000100002A9F0000000000000000", "xyz"),
    "key": ("k1", "FuzzNs", ""),
    "namespace": ("FuzzNs", ""),
    "value": ("v", ""),
    "transactionId": ("tx", ""),
}
_VARIANTS: Final = (
    "plausible",
    "one_weird",
    "garbage",
    "wrong_types",
    "missing",
    "weird",
    "huge",
    "bad_body",
    "binary",
)


def plausible_value(name: str, rnd: random.Random) -> str:
    if name in _TOPIC_KEYS:
        return rnd.choice(FUZZ_TOPICS)
    if name in _GROUP_KEYS:
        return rnd.choice(FUZZ_GROUPS)
    if name in _BROKER_KEYS:
        return rnd.choice(FUZZ_BROKERS)
    if name == "i":  # the v2 send header's properties
        return rnd.choice(_TEXT_VALUES["properties"])
    if name in _TEXT_VALUES:
        return rnd.choice(_TEXT_VALUES[name])
    return rnd.choice((*NUMBERS, "true", "false"))


# Values a request is most likely served with: a plain (not compressed, not batch) send, topics
# created readable and writable with 4 queues, a commit.
_PREFERRED: Final = {
    "sysFlag": "0",
    "f": "0",
    "batch": "false",
    "m": "false",
    "perm": "6",
    "readQueueNums": "4",
    "writeQueueNums": "4",
    "maxMsgNums": "32",
    "commitOrRollback": "8",
    "suspendTimeoutMillis": "0",
    "queueId": "0",
    "e": "0",
    "defaultTopicQueueNums": "4",
    "d": "4",
    "defaultTopic": "TBW102",  # sends to FuzzTopic auto-create it
    "c": "TBW102",
}


def _candidates(name: str) -> tuple[str, ...]:
    """Valid-looking values of wire field `name`, the likeliest first."""
    if name in _PREFERRED:
        return (_PREFERRED[name], "1", "0")
    if name in _TOPIC_KEYS:
        return ("FuzzTopic",)
    if name in _GROUP_KEYS:
        return ("FuzzGroup",)
    if name in _BROKER_KEYS:
        return ("FuzzBroker", "127.0.0.1:1")
    if name == "i":
        return _TEXT_VALUES["properties"][:1]
    if name in _TEXT_VALUES:
        return (*_TEXT_VALUES[name][:1], "1")
    return ("1", "0", "false", "4", "6", "x")


def _header_faults(fields: dict[str, str]) -> set[str]:
    """The wire names some typed header refuses in `fields` (its error quotes the name)."""
    faults: set[str] = set()
    for cls in HEADER_CLASSES:
        try:
            cls.from_fields(fields)
        except ProtocolError as exc:
            faults |= {name for name in fields if f"'{name}'" in str(exc)}
    return faults


def _valid_fields() -> dict[str, str]:
    """One value for every wire name such that every typed header parses the whole map (a
    handler ignores fields its header does not read), found by trying each name's candidates
    until no header names it in a refusal."""
    tried = dict.fromkeys(WIRE_NAMES, 0)
    fields = {name: _candidates(name)[0] for name in WIRE_NAMES}
    while faults := _header_faults(fields):
        progressed = False
        for name in faults:
            options = _candidates(name)
            if tried[name] + 1 < len(options):
                tried[name] += 1
                fields[name] = options[tried[name]]
                progressed = True
        if not progressed:
            break
    return fields


# Parses as every typed header: requests built from it get past each handler's header parse.
VALID_FIELDS: Final = _valid_fields()


def plausible_fields(rnd: random.Random) -> dict[str, str]:
    """VALID_FIELDS with a few fields dropped or given another plausible value."""
    fields = dict(VALID_FIELDS)
    for name in rnd.sample(sorted(fields), k=3):
        if rnd.random() < 0.5:
            del fields[name]
        else:
            fields[name] = plausible_value(name, rnd)
    return fields


# Bodies of the right shape for some codes (heartbeat, queue locks, an end-batch), so the fuzz
# also reaches what handlers do after parsing: an SQL92 subscription, locks on fuzz queues.
WELL_FORMED_BODIES: Final = (
    orjson.dumps(
        {
            "clientID": "fuzz@1",
            "producerDataSet": [{"groupName": "FuzzGroup"}],
            "consumerDataSet": [
                {
                    "groupName": "FuzzGroup",
                    "consumeType": "CONSUME_PASSIVELY",
                    "messageModel": "CLUSTERING",
                    "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                    "subscriptionDataSet": [
                        {
                            "topic": "FuzzTopic",
                            "subString": "a > 1 AND (b IS NULL OR TAGS IN ('x', 'y'))",
                            "expressionType": "SQL92",
                            "tagsSet": [],
                            "codeSet": [],
                            "subVersion": 1,
                            "classFilterMode": False,
                        }
                    ],
                    "unitMode": False,
                }
            ],
        }
    ),
    orjson.dumps(
        {
            "consumerGroup": "FuzzGroup",
            "clientId": "fuzz@1",
            "onlyThisBroker": False,
            "mqSet": [{"topic": "FuzzTopic", "brokerName": "FuzzBroker", "queueId": 0}],
        }
    ),
    orjson.dumps({"txns": [{"a": 1}, {"producerGroup": 5}, []]}),
)
# 8 MiB of zeros in about 8 KiB: a COMPRESSED body that must not be inflated whole.
ZLIB_BOMB: Final = zlib.compress(bytes(8 * 1024 * 1024), 9)


def bad_body(rnd: random.Random) -> bytes:
    """A body of the wrong shape: random bytes, JSON of other types, deep nesting, a zlib bomb,
    a batch body with a lying length, or properties text."""
    batch = encode_batch([BatchItem(0, b"x" * 10, "TAGS\x01t\x02")])
    choices: list[bytes] = [
        b"",
        rnd.randbytes(rnd.randrange(1, 2048)),
        b"{}",
        b"[]",
        b"null",
        b'{"clientID":5,"producerDataSet":"x","consumerDataSet":[{"groupName":[]}]}',
        b'{"topicConfigSerializeWrapper":{"topicConfigTable":7},"filterServerList":{}}',
        b'{"mqSet":[{"topic":1,"brokerName":null,"queueId":"q"}],"consumerGroup":{}}',
        b"[" * 5000 + b"]" * 5000,
        b'{"a":' * 2000 + b"1" + b"}" * 2000,
        ZLIB_BOMB,
        batch[:-3],
        batch[:16] + struct.pack(">i", 2**31 - 1) + batch[20:],
        b"TAGS\x01t\x02\xff\xfe",
        batch,
        *WELL_FORMED_BODIES,
        orjson.dumps({"k": "\u0000" * 100, "n": 2**63 - 1, "f": 1e308}),
    ]
    return rnd.choice(choices)


def _wrong_type_header(command: RemotingCommand, rnd: random.Random) -> bytes:
    """The JSON frame of `command` with every extFields value replaced by a non-string."""
    kinds: list[Any] = [0, -1, 2**63, 1.5e300, True, False, None, [], {}, [1, "a"], {"a": {"b": 1}}]
    header = {
        "code": command.code,
        "extFields": {key: rnd.choice(kinds) for key in command.ext_fields},
        "flag": command.flag,
        "language": "JAVA",
        "opaque": command.opaque,
        "serializeTypeCurrentRPC": "JSON",
        "version": 401,
    }
    text = orjson.dumps(header)
    return struct.pack(">II", 4 + len(text) + len(command.body), len(text)) + text + command.body


# Signs (or mis-signs, or leaves unsigned) a request before it is encoded: the ACL run's choice.
Signer = Callable[[RemotingCommand, random.Random], None]


def acl_signer(accounts: tuple[Credentials, ...]) -> Signer:
    """For a server with ACL on: half the requests signed by one of `accounts` (valid ones, so
    the fuzz reaches the handlers behind the ACL hook), the other half unsigned, signed by an
    unknown key or with a wrong secret, altered after signing, or with a garbage signature."""

    def signer(command: RemotingCommand, rnd: random.Random) -> None:
        account = rnd.choice(accounts)
        way = rnd.choice(("valid",) * 5 + ("none", "unknown", "secret", "altered", "garbage"))
        if way == "valid":
            sign(command, account)
        elif way == "unknown":
            sign(command, Credentials("FuzzUnknownAK", account.secret_key))
        elif way == "secret":
            sign(command, Credentials(account.access_key, "wrong-" + account.secret_key))
        elif way == "altered":
            sign(command, account)
            command.ext_fields["fuzzAltered"] = "1"
        elif way == "garbage":
            sign(command, account)
            command.ext_fields[SIGNATURE] = rnd.choice(("", "=", "x" * 500, "\u00e9"))

    return signer


@dataclass(frozen=True, slots=True)
class FuzzFrame:
    """One encoded request, its opaque, and whether the server owes it an answer (owes_answer),
    with its code and variant for the report of one that went unanswered."""

    data: bytes
    opaque: int
    answered: bool | None  # None: may or may not be (owes_answer)
    code: int = 0
    variant: str = ""


def request_variants(
    code: int, opaques: Iterator[int], rnd: random.Random, signer: Signer | None = None
) -> Iterator[FuzzFrame]:
    """One frame of each variant for `code` (each a whole, well-formed frame), signed by
    `signer` when given."""
    for variant in _VARIANTS:
        fields = plausible_fields(rnd)
        body = rnd.choice((b"", b"hello", *WELL_FORMED_BODIES))
        serialize = SerializeType.JSON
        if variant == "garbage":
            fields = {
                rnd.randbytes(4).hex(): rnd.randbytes(rnd.randrange(40)).hex() for _ in range(5)
            }
        elif variant == "missing":
            fields = {}
        elif variant == "one_weird":
            fields[rnd.choice(sorted(fields))] = rnd.choice(WEIRD_FIELD_VALUES)
        elif variant == "weird":
            fields = {name: rnd.choice(WEIRD_FIELD_VALUES) for name in fields}
        elif variant == "huge" and fields:
            fields[rnd.choice(sorted(fields))] = "9" * HUGE_VALUE_BYTES
        elif variant == "bad_body":
            body = bad_body(rnd)
        elif variant == "binary":
            serialize = SerializeType.ROCKETMQ
        # One request in eight is oneway (not answered) and one in sixteen claims to be a
        # response (to nothing the server asked).
        flag = rnd.choice((0,) * 13 + (FLAG_ONEWAY,) * 2 + (FLAG_RESPONSE,))
        command = RemotingCommand(
            code, next(opaques), flag, fields, body, serialize_type=serialize, language="JAVA"
        )
        if signer is not None:
            signer(command, rnd)
        data = _wrong_type_header(command, rnd) if variant == "wrong_types" else encode(command)
        yield FuzzFrame(data, command.opaque, owes_answer(flag, data), code, variant)


def owes_answer(flag: int, frame: bytes) -> bool | None:
    """Whether a server must answer `frame`: not when oneway or flagged as a response; and an
    END_TRANSACTION whose commitOrRollback is NOT (0) is, as upstream, not answered at all
    (broker/handlers/end_transaction.py) unless refused before its handler (an ACL refusal is
    answered): None, either is right. Every other request is owed an answer."""
    if flag != 0:
        return False
    try:
        command = decode_frame(frame[4:])
        if command.code == RequestCode.END_TRANSACTION:
            header = EndTransactionRequestHeader.from_fields(command.ext_fields)
            return None if header.commit_or_rollback == 0 else True
    except ProtocolError:
        pass  # the server answers a header it cannot parse with SYSTEM_ERROR
    return True


def _random_mutation(rnd: random.Random, size: int) -> Mutation:
    position = rnd.randrange(max(1, size))
    options: list[Mutation] = [
        IntField(rnd.randrange(64), rnd.choice([0, -1, 2**31 - 1, 2**24, 7]), False),
        IntField(rnd.randrange(64), rnd.choice([-1, 1]), True),
        Flip(position, rnd.randrange(8)),
        Insert(position, rnd.randbytes(rnd.randrange(1, 9))),
        Delete(position, rnd.randrange(1, 9)),
        Truncate(position),
        BadUtf8(position, b"\xff\xfe"),
    ]
    return rnd.choice(options)


def malformed(
    code: int,
    opaques: Iterator[int],
    rnd: random.Random,
    count: int,
    signer: Signer | None = None,
) -> Iterator[bytes]:
    """`count` byte-mutated frames of plausible requests for `code` (JSON and binary)."""
    for _ in range(count):
        serialize = rnd.choice(list(SerializeType))
        command = RemotingCommand(
            code, next(opaques), 0, plausible_fields(rnd), b"", serialize_type=serialize
        )
        if signer is not None:
            signer(command, rnd)
        frame = encode(command)
        sample = Sample(frame, tuple(frame_fields(frame, 0, command)))
        edits = [_random_mutation(rnd, len(frame)) for _ in range(rnd.randrange(1, 4))]
        yield apply(sample, edits)
