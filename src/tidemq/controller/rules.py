"""The safety rules a GroupMember decides by (member.py): pure functions of the group state, the
replica's own records (epoch file, standing record) and the alive records; the member logs the
refusals they return.

    state missing ───────────> create_refusal   epoch 1 only by a history-less replica, and only
                                                while no alive peer may hold history
    master gone, me in syncSet > stand_refusal    only with the current epoch recorded,
                                 data_refusal     and a log reaching the epoch's start
    named master, not acting ─> resumes          a CAS won before a crash, epoch not recorded:
                                                finish that election

Why the standing record (Replica.note_standing) and not the epoch file alone: a replica records
an epoch it won only after the CAS (become_master stops the running app first), so a crash or a
lost CAS answer in between leaves etcd naming it master of an epoch its epoch file lacks. Its
epoch file then looks like a wiped store's (which must never stand); the standing record, written
before the CAS, is what a wiped store does not have.
"""

from __future__ import annotations

from collections.abc import Mapping

from tidemq.controller.state import AliveRecord, GroupState


def create_refusal(alive: Mapping[int, AliveRecord | None], me: int, last: int) -> str | None:
    """Why replica `me` (last recorded epoch `last`) may not create a missing state (None: it
    may). A fresh epoch 1 starts a new history: created while a replica holding the old one is
    alive, that replica refuses to follow it (its epoch is unknown to the new history) and the
    acknowledged messages it holds are orphaned. An unreadable record, or one without a last
    epoch (an older version), may be such a replica."""
    if last != 0:
        return (
            f"this replica has epoch history (last epoch {last}): restore it or wipe this replica"
        )
    holders = sorted(
        i
        for i, record in alive.items()
        if i != me and (record is None or record.last_epoch is None or record.last_epoch > 0)
    )
    if holders:
        return (
            f"alive replicas {holders} may hold the group's history (their alive records show "
            "a last epoch > 0, or none): restore it"
        )
    return None


def stand_refusal(state: GroupState, last: int) -> str | None:
    """Why a syncSet member whose last recorded epoch is `last` may not stand for election from
    `state` (None: it may). Every genuine syncSet member of epoch E has recorded E (a master at
    promotion, a slave before it follows); one that has not (a wiped store back under its old
    id, whose log may even reach the epoch's start) lacks what E's master acknowledged."""
    if last == state.epoch:
        return None
    return (
        f"epoch {state.epoch}: my last recorded epoch is {last}, so this replica (wiped, or never "
        "followed this epoch's master) may lack acknowledged messages: not standing"
    )


def data_refusal(state: GroupState, offset: int) -> str | None:
    """Why a replica whose log ends at `offset` may not stand for (or finish) an election from
    `state` (None: it may). A log that ends before the current epoch's start cannot hold what
    that epoch's master acknowledged (a wiped store under an old id)."""
    start = state.epochs[-1][1]
    if offset >= start:
        return None
    return (
        f"epoch {state.epoch} starts at {start} but my log ends at {offset}: this replica lacks "
        "the group's data and will not stand"
    )


def previous_epoch(state: GroupState) -> int | None:
    """The epoch before state.epoch in the history (0 before epoch 1; None: trimmed away)."""
    if len(state.epochs) >= 2:
        return state.epochs[-2][0]
    return 0 if state.epoch == 1 else None


def resumes(state: GroupState, me: int, last: int, standing: int) -> bool:
    """True when replica `me` won state.epoch's CAS (it noted standing for that epoch, and etcd
    names it master) but crashed before recording the epoch, and its log is still that of the
    epoch before (`last` is the history's previous epoch: 0 for epoch 1, a group's creator).

    Then nobody acknowledged anything in state.epoch (the epoch is recorded before the master
    app serves, and syncSet grows only under an acting master), so finishing the election is
    safe. Finishing it, rather than electing state.epoch + 1, keeps this true however often the
    same gap is hit: a new epoch would be in the history while the epoch file still lacks
    state.epoch, and the next crash there would wedge the group."""
    if state.master != me or standing != state.epoch or last >= state.epoch:
        return False
    return last == previous_epoch(state)
