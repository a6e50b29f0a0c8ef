"""Signatures, the resources of each request code, the Authorizer's decisions and the reload
of the ACL file (security/signing.py, resources.py, acl.py), without a socket."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
from pathlib import Path

import pytest
from acl_samples import ACL_YAML, ADMIN, CONSUMER, PRODUCER, STRANGER, send_command, write_acl

from tidemq.errors import ProtocolError
from tidemq.protocol.bodies_client import (
    ConsumerData,
    HeartbeatData,
    ProducerData,
    SubscriptionData,
)
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.security.acl import AclFileWatcher, Authorizer, load_authorizer
from tidemq.security.acl_file import parse_acl
from tidemq.security.permissions import Perm
from tidemq.security.resources import BROKER_POLICY, NAMESRV_POLICY
from tidemq.security.signing import Credentials, sign, signature, signature_matches

LOCAL = "127.0.0.1"


# -- signatures -----------------------------------------------------------------------------


def test_signature_matches_an_independent_computation() -> None:
    fields = {"b": "TopicA", "a": "PG", "AccessKey": "producerAK", "OnsChannel": "LOCAL"}
    body = b"\x00body\xff"
    # By hand: values ordered by key (AccessKey < OnsChannel < a < b in byte order), then body.
    content = b"producerAK" + b"LOCAL" + b"PG" + b"TopicA" + body
    expected = base64.b64encode(
        hmac.new(b"producerSK-example", content, hashlib.sha1).digest()
    ).decode()
    assert signature("producerSK-example", fields, body) == expected
    # Pinned (computed with `openssl dgst -sha1 -hmac`): a change of formula shows here.
    assert expected == "U1X8zhcXCnmzI019HKPPzrLdMVg="


def test_sign_adds_access_key_then_a_signature_over_it() -> None:
    cmd = send_command("TopicA")
    sign(cmd, PRODUCER)
    assert cmd.ext_fields["AccessKey"] == PRODUCER.access_key
    assert signature_matches(PRODUCER.secret_key, cmd.ext_fields, cmd.body)
    assert not signature_matches(CONSUMER.secret_key, cmd.ext_fields, cmd.body)
    cmd.ext_fields["b"] = "TopicB"  # any field changed after signing breaks it
    assert not signature_matches(PRODUCER.secret_key, cmd.ext_fields, cmd.body)


def test_unique_key_query_may_be_left_out_of_the_signature() -> None:
    authorizer = Authorizer(parse_acl(ACL_YAML))
    fields = {"topic": "TopicB", "key": "k", "maxNum": "32", "beginTimestamp": "0"}
    # A Java client before 4.9.4 signs, then adds the flag; upstream signs without it.
    late = _cmd(RequestCode.QUERY_MESSAGE, dict(fields))
    sign(late, PRODUCER)
    late.ext_fields["_UNIQUE_KEY_QUERY"] = "true"
    assert authorizer.check(late, LOCAL) is None
    early = _cmd(RequestCode.QUERY_MESSAGE, {**fields, "_UNIQUE_KEY_QUERY": "true"})
    sign(early, PRODUCER)
    assert authorizer.check(early, LOCAL) is None
    other = _cmd(RequestCode.QUERY_MESSAGE, dict(fields))
    sign(other, PRODUCER)
    other.ext_fields["maxNum"] = "64"  # any other field added or changed still breaks it
    refused = authorizer.check(other, LOCAL)
    assert refused is not None
    assert refused.code == ResponseCode.SYSTEM_ERROR


# -- resources per code ---------------------------------------------------------------------


def _cmd(code: int, fields: dict[str, str], body: bytes = b"") -> RemotingCommand:
    return RemotingCommand(code=code, ext_fields=fields, body=body)


def test_send_names_its_topic_in_the_spelling_the_handler_reads() -> None:
    assert list(BROKER_POLICY.needs(send_command("T1", v2=True))) == [("T1", Perm.PUB)]
    assert list(BROKER_POLICY.needs(send_command("T1", v2=False))) == [("T1", Perm.PUB)]
    # A V2 header with a V1 "topic" beside it: the handler reads "b", so does the check.
    mixed = send_command("Real", v2=True)
    mixed.ext_fields["topic"] = "Decoy"
    assert list(BROKER_POLICY.needs(mixed)) == [("Real", Perm.PUB)]
    batch = send_command("T2", v2=True)
    batch.code = RequestCode.SEND_BATCH_MESSAGE
    assert list(BROKER_POLICY.needs(batch)) == [("T2", Perm.PUB)]


@pytest.mark.parametrize(
    ("code", "fields", "needs"),
    [
        (
            RequestCode.PULL_MESSAGE,
            {"topic": "T", "consumerGroup": "G"},
            [("T", Perm.SUB), ("%RETRY%G", Perm.SUB)],
        ),
        (
            RequestCode.CONSUMER_SEND_MSG_BACK,
            {"group": "G", "originTopic": "T", "offset": "1"},
            [("T", Perm.PUB), ("%RETRY%G", Perm.SUB)],
        ),
        (RequestCode.QUERY_MESSAGE, {"topic": "T", "key": "k"}, [("T", Perm.SUB)]),
        (RequestCode.UNREGISTER_CLIENT, {"consumerGroup": "G"}, [("%RETRY%G", Perm.SUB)]),
        (RequestCode.UNREGISTER_CLIENT, {"producerGroup": "P"}, []),
        (RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"}, [("%RETRY%G", Perm.SUB)]),
        (
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": "G", "topic": "T", "queueId": "0"},
            [("%RETRY%G", Perm.SUB), ("T", Perm.SUB)],
        ),
        (
            RequestCode.QUERY_CONSUMER_OFFSET,
            {"consumerGroup": "G", "topic": "T", "queueId": "0"},
            [("%RETRY%G", Perm.SUB), ("T", Perm.SUB)],
        ),
        # The half's real topic is the handler's check; the header's topic is ignored.
        (RequestCode.END_TRANSACTION, {"producerGroup": "P"}, [("%RETRY%P", Perm.ANY)]),
        (
            RequestCode.END_TRANSACTION,
            {"producerGroup": "P", "topic": "T"},
            [("%RETRY%P", Perm.ANY)],
        ),
        (RequestCode.SEND_MESSAGE, {"topic": "%RETRY%G"}, [("%RETRY%G", Perm.SUB)]),
        (RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": "0"}, [("T", Perm.SUB)]),
        (RequestCode.GET_MIN_OFFSET, {"topic": "T", "queueId": "0"}, [("T", Perm.SUB)]),
        (RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": "T"}, [("T", Perm.SUB)]),
        (RequestCode.GET_EARLIEST_MSG_STORETIME, {"topic": "T"}, [("T", Perm.SUB)]),
        (RequestCode.GET_TOPIC_STATS_INFO, {"topic": "T"}, [("T", Perm.SUB)]),
        (
            RequestCode.GET_CONSUME_STATS,
            {"consumerGroup": "G", "topic": "T"},
            [("%RETRY%G", Perm.SUB), ("T", Perm.SUB)],
        ),
        (RequestCode.GET_CONSUME_STATS, {"consumerGroup": "G"}, [("%RETRY%G", Perm.SUB)]),
        (
            RequestCode.GET_CONSUMER_CONNECTION_LIST,
            {"consumerGroup": "G"},
            [("%RETRY%G", Perm.SUB)],
        ),
        (RequestCode.GET_BROKER_CONFIG, {}, []),
    ],
)
def test_resources_of_each_code(
    code: int, fields: dict[str, str], needs: list[tuple[str, Perm]]
) -> None:
    assert list(BROKER_POLICY.needs(_cmd(code, fields))) == needs


def test_heart_beat_names_consumer_groups_their_topics_and_producer_groups() -> None:
    body = HeartbeatData(
        client_id="c1",
        producer_data_set=[ProducerData("PG"), ProducerData("CLIENT_INNER_PRODUCER")],
        consumer_data_set=[
            ConsumerData(
                "CG", subscription_data_set=[SubscriptionData("T1"), SubscriptionData("T2")]
            )
        ],
    ).to_json()
    needs = BROKER_POLICY.needs(_cmd(RequestCode.HEART_BEAT, {}, body))
    # A producer group only may not be DENY (PUB or SUB); the clients' inner one is not named.
    assert list(needs) == [
        ("%RETRY%CG", Perm.SUB),
        ("T1", Perm.SUB),
        ("T2", Perm.SUB),
        ("%RETRY%PG", Perm.ANY),
    ]
    with pytest.raises(ProtocolError):
        BROKER_POLICY.needs(_cmd(RequestCode.HEART_BEAT, {}, b"not json"))


@pytest.mark.parametrize(
    "code",
    [
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        RequestCode.DELETE_TOPIC_IN_BROKER,
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        RequestCode.DELETE_SUBSCRIPTIONGROUP,
        RequestCode.UPDATE_BROKER_CONFIG,
        RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
        RequestCode.GET_ALL_TOPIC_CONFIG,
        RequestCode.GET_ALL_CONSUMER_OFFSET,
        RequestCode.GET_ALL_DELAY_OFFSET,
        RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
        RequestCode.TIDEMQ_TX_LIST,
    ],
)
def test_admin_codes(code: int) -> None:
    assert BROKER_POLICY.needs_admin(code)


def test_ordinary_codes_are_not_admin() -> None:
    for code in (RequestCode.SEND_MESSAGE_V2, RequestCode.PULL_MESSAGE, RequestCode.HEART_BEAT):
        assert not BROKER_POLICY.needs_admin(code)
    assert not NAMESRV_POLICY.needs_admin(RequestCode.GET_ROUTEINFO_BY_TOPIC) or (
        RequestCode.GET_ROUTEINFO_BY_TOPIC in NAMESRV_POLICY.open_codes
    )


# -- decisions ------------------------------------------------------------------------------


@pytest.fixture
def authorizer() -> Authorizer:
    return Authorizer(parse_acl(ACL_YAML))


def _signed(cmd: RemotingCommand, credentials: Credentials) -> RemotingCommand:
    sign(cmd, credentials)
    return cmd


def _refusal(
    authorizer: Authorizer, cmd: RemotingCommand, host: str = LOCAL
) -> tuple[int, str] | None:
    answer = authorizer.check(cmd, host)
    if answer is None:
        return None
    assert answer.opaque == cmd.opaque
    return answer.code, answer.remark or ""


def test_a_signed_send_with_permission_is_allowed(authorizer: Authorizer) -> None:
    assert _refusal(authorizer, _signed(send_command("TopicA"), PRODUCER)) is None
    assert _refusal(authorizer, _signed(send_command("TopicB"), PRODUCER)) is None


def test_unsigned_requests_are_refused(authorizer: Authorizer) -> None:
    assert _refusal(authorizer, send_command("TopicA")) == (
        ResponseCode.SYSTEM_ERROR,
        "No accessKey is configured",
    )


def test_an_unknown_key_is_refused_without_a_word_about_the_topic(
    authorizer: Authorizer,
) -> None:
    assert _refusal(authorizer, _signed(send_command("TopicA"), STRANGER)) == (
        ResponseCode.SYSTEM_ERROR,
        f"No acl config for {STRANGER.access_key}",
    )


def test_a_wrong_signature_is_refused(authorizer: Authorizer) -> None:
    forged = _signed(send_command("TopicA"), Credentials(PRODUCER.access_key, "guessedSecret"))
    assert _refusal(authorizer, forged) == (
        ResponseCode.SYSTEM_ERROR,
        f"Check signature failed for accessKey={PRODUCER.access_key}",
    )
    tampered = _signed(send_command("TopicA", b"body"), PRODUCER)
    tampered.body = b"other body"
    assert _refusal(authorizer, tampered) is not None


@pytest.mark.parametrize(
    ("topic", "why"),
    [
        ("TopicC", "No permission for topic:TopicC: accessKey=producerAK needs PUB"),
        ("TopicD", "No permission for topic:TopicD: accessKey=producerAK needs PUB"),
        ("Unlisted", "No permission for topic:Unlisted: accessKey=producerAK needs PUB"),
    ],
)
def test_a_send_without_pub_is_refused_no_permission(
    authorizer: Authorizer, topic: str, why: str
) -> None:
    assert _refusal(authorizer, _signed(send_command(topic), PRODUCER)) == (
        ResponseCode.NO_PERMISSION,
        why,
    )


def test_group_permissions_decide_retry_topics(authorizer: Authorizer) -> None:
    pull = _cmd(RequestCode.PULL_MESSAGE, {"topic": "TopicB", "consumerGroup": "GroupD"})
    assert _refusal(authorizer, _signed(pull, PRODUCER)) == (
        ResponseCode.NO_PERMISSION,
        "No permission for group:GroupD: accessKey=producerAK needs SUB",
    )
    pull = _cmd(RequestCode.PULL_MESSAGE, {"topic": "TopicB", "consumerGroup": "AnyGroup"})
    assert _refusal(authorizer, _signed(pull, PRODUCER)) is None  # defaultGroupPerm SUB
    # A send to a group's retry topic is that group's consumers' retry: SUB on the group, as
    # upstream 4.9 (GroupA has PUB|SUB, others SUB by default, GroupD DENY).
    assert _refusal(authorizer, _signed(send_command("%RETRY%GroupA"), PRODUCER)) is None
    assert _refusal(authorizer, _signed(send_command("%RETRY%Other"), PRODUCER)) is None
    assert _refusal(authorizer, _signed(send_command("%RETRY%GroupD"), PRODUCER)) == (
        ResponseCode.NO_PERMISSION,
        "No permission for group:GroupD: accessKey=producerAK needs SUB",
    )


def test_admin_codes_need_an_admin_account(authorizer: Authorizer) -> None:
    create = _cmd(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "X"})
    assert _refusal(authorizer, _signed(create, PRODUCER)) == (
        ResponseCode.NO_PERMISSION,
        f"Need admin permission for request code=17, but accessKey={PRODUCER.access_key} is not",
    )
    create = _cmd(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "X"})
    assert _refusal(authorizer, _signed(create, ADMIN)) is None
    # The admin lists no permission: unrestricted, as upstream.
    assert _refusal(authorizer, _signed(send_command("Anything"), ADMIN)) is None


def test_global_white_list_needs_no_signature(authorizer: Authorizer) -> None:
    assert _refusal(authorizer, send_command("TopicD"), "10.10.103.7") is None
    assert _refusal(authorizer, send_command("TopicD"), "10.10.104.7") is not None


def test_account_white_address_skips_the_signature_not_the_permissions(
    authorizer: Authorizer,
) -> None:
    cmd = send_command("X")
    cmd.ext_fields["AccessKey"] = ADMIN.access_key  # no Signature at all
    assert _refusal(authorizer, cmd, "192.168.1.20") is None
    assert _refusal(authorizer, cmd, "192.168.2.20") is not None
    consumer_table = parse_acl(
        ACL_YAML.replace(
            f"secretKey: {CONSUMER.secret_key}\n",
            f"secretKey: {CONSUMER.secret_key}\n    whiteRemoteAddress: 127.0.0.1\n",
        )
    )
    white = Authorizer(consumer_table)
    cmd = send_command("X")
    cmd.ext_fields["AccessKey"] = CONSUMER.access_key
    refused = _refusal(white, cmd)
    assert refused is not None
    assert refused[0] == ResponseCode.NO_PERMISSION  # signature skipped, PUB still missing


def test_namesrv_reads_need_a_signature_and_writes_need_admin() -> None:
    namesrv = Authorizer(parse_acl(ACL_YAML), NAMESRV_POLICY)
    route = _cmd(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    assert _refusal(namesrv, route) == (ResponseCode.SYSTEM_ERROR, "No accessKey is configured")
    assert _refusal(namesrv, _signed(route, PRODUCER)) is None
    # QUERY_DATA_VERSION refreshes a broker's liveness: the registering account's business.
    version = _cmd(RequestCode.QUERY_DATA_VERSION, {"brokerAddr": "127.0.0.1:10911"})
    refused = _refusal(namesrv, _signed(version, PRODUCER))
    assert refused is not None
    assert refused[0] == ResponseCode.NO_PERMISSION
    version = _cmd(RequestCode.QUERY_DATA_VERSION, {"brokerAddr": "127.0.0.1:10911"})
    assert _refusal(namesrv, _signed(version, ADMIN)) is None
    register = _cmd(RequestCode.REGISTER_BROKER, {"brokerName": "rogue"})
    assert _refusal(namesrv, register) == (
        ResponseCode.SYSTEM_ERROR,
        "No accessKey is configured",
    )
    refused = _refusal(namesrv, _signed(register, PRODUCER))
    assert refused is not None
    assert refused[0] == ResponseCode.NO_PERMISSION
    register = _cmd(RequestCode.REGISTER_BROKER, {"brokerName": "good"})
    assert _refusal(namesrv, _signed(register, ADMIN)) is None
    unknown = _cmd(9999, {})
    assert _refusal(namesrv, _signed(unknown, PRODUCER)) is not None


# -- reload ---------------------------------------------------------------------------------


def test_reload_takes_a_changed_file_and_keeps_the_old_table_on_a_bad_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_YAML)
    authorizer, watcher = load_authorizer(path)
    assert not watcher.poll()  # nothing changed
    cmd = _signed(send_command("TopicA"), PRODUCER)
    assert authorizer.check(cmd, LOCAL) is None

    write_acl(path, ACL_YAML.replace("TopicA=PUB", "TopicA=DENY"))
    assert watcher.poll()
    assert authorizer.check(_signed(send_command("TopicA"), PRODUCER), LOCAL) is not None

    with caplog.at_level(logging.ERROR, logger="tidemq.security.acl"):
        write_acl(path, "accounts: [\n")
        assert not watcher.poll()
        write_acl(path, "accounts: [\n ")  # the same error again: not logged again
        assert not watcher.poll()
    assert watcher.last_error is not None
    errors = [r for r in caplog.records if "not reloaded" in r.getMessage()]
    assert len(errors) == 1
    # The old table (TopicA=DENY) is still in force.
    assert authorizer.check(_signed(send_command("TopicA"), PRODUCER), LOCAL) is not None
    assert authorizer.check(_signed(send_command("TopicB"), PRODUCER), LOCAL) is None

    write_acl(path, ACL_YAML)  # fixed: reloaded, the error cleared
    assert watcher.poll()
    assert watcher.last_error is None
    assert authorizer.check(_signed(send_command("TopicA"), PRODUCER), LOCAL) is None


def test_a_rewrite_with_the_same_content_reloads_nothing(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_YAML)
    _, watcher = load_authorizer(path)
    write_acl(path, ACL_YAML)
    assert not watcher.poll()
    assert watcher.reloads == 0


def test_a_deleted_file_keeps_the_table(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_YAML)
    authorizer, watcher = load_authorizer(path)
    path.unlink()
    assert not watcher.poll()
    assert watcher.last_error is not None
    assert "cannot read" in watcher.last_error
    assert authorizer.check(_signed(send_command("TopicA"), PRODUCER), LOCAL) is None
    assert isinstance(watcher, AclFileWatcher)
