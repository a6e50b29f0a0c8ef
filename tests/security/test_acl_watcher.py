"""The ACL file watcher hashes the file on every poll: an edit that keeps the size and leaves
the mtime where it was (one file-system tick, or set back) is still reloaded."""

from __future__ import annotations

import os
from pathlib import Path

from acl_samples import ACL_YAML, PRODUCER, send_command

from tidemq.security.acl import load_authorizer
from tidemq.security.signing import sign

LOCAL = "127.0.0.1"


def test_a_same_size_edit_with_the_old_mtime_is_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_YAML)
    authorizer, watcher = load_authorizer(path)
    stat = path.stat()
    cmd = send_command("TopicA")
    sign(cmd, PRODUCER)
    assert authorizer.check(cmd, LOCAL) is None
    # "TopicA=PUB" → "TopicA=SUB": the same size, PUB revoked.
    edited = ACL_YAML.replace("TopicA=PUB", "TopicA=SUB")
    assert len(edited) == len(ACL_YAML)
    path.write_text(edited)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    assert watcher.poll()
    cmd = send_command("TopicA")
    sign(cmd, PRODUCER)
    assert authorizer.check(cmd, LOCAL) is not None
    assert not watcher.poll()  # read again, hashed the same: nothing to reload
    assert watcher.reloads == 1
