"""Replica: what a GroupMember steers (member.py), implemented by the broker (broker/failover.py).

    GroupMember ──decides──> Replica (the broker: its store, its HA link, its role)
         ^                       │
         └── offsets, epochs ────┘

Kept apart from member.py so that the state machine's module stays small; member.py re-exports
it.
"""

from __future__ import annotations

from typing import Protocol

from tidemq.controller.state import GroupState


class Replica(Protocol):
    """What the member steers: the broker (broker/failover.py) implements it.

    The member calls the async methods one at a time, from one task, in orders such as:

        become_slave(E1) ... stop_replicating, become_master(E2)          a won election
        become_slave(E1) ... stop_replicating, become_slave(E2)           a lost one
        become_master(E1) ... step_down(why), become_slave(E2)            deposed
        become_master(E1) ... step_down("master lease lost"), become_master(E2)   fenced, then
                                                                          re-elected itself
    note_standing(E) comes before each CAS that would make this replica master of E. A
    replica that restarts named master of E with standing() == E but E not recorded yet gets
    stop_replicating, become_master(E) (it finishes the election it won).
    become_master of the group's first epoch comes without stop_replicating. A method that
    raises is called again on a later tick. The member's step_down can come late (etcd calls
    in flight): the broker checks GroupMember.may_acknowledge() (or the lease's valid()) before
    each acknowledgement itself.
    """

    @property
    def broker_id(self) -> int:
        """The replica id (brokerId >= 1), distinct in the group."""
        ...

    def address(self) -> str:
        """Where clients reach this broker, "ip:port"."""
        ...

    def ha_address(self) -> str:
        """This broker's HA listener, "ip:port" (what slaves of a master connect to)."""
        ...

    def max_offset(self) -> int:
        """The commit log's end."""
        ...

    def last_epoch(self) -> int:
        """The last epoch in the replica's epoch file (0: none). The broker records epoch E
        when it becomes master of E and before it follows E's master, so every genuine syncSet
        member of epoch E reports E; a wiped store reports 0 and may not stand."""
        ...

    def note_standing(self, epoch: int) -> None:
        """Durably record "standing for `epoch`" (it replaces any earlier record); called before
        every CAS that would make this replica master of `epoch` (create or election). Raises
        if it cannot be recorded: the member then does not CAS.

        Why: the CAS and the epoch file's append (in become_master) are two steps, and a crash
        (or a lost CAS answer) between them leaves etcd naming this replica master of an epoch
        its epoch file does not show. Only this record tells such a replica from a wiped one
        under the same id, and lets it finish the election instead of wedging the group."""
        ...

    def standing(self) -> int:
        """The epoch of the last note_standing (0: none, e.g. a wiped store)."""
        ...

    async def stop_replicating(self) -> int:
        """Stop following any master; returns the log end, final until become_master/slave."""
        ...

    async def become_master(self, state: GroupState) -> None:
        """Serve as master of `state.epoch` (the state is already CASed with us as master)."""
        ...

    async def become_slave(self, state: GroupState) -> None:
        """Truncate as state.epochs requires, then follow state.master_ha_addr."""
        ...

    async def step_down(self, reason: str) -> None:
        """Stop acknowledging now (fenced); the member follows whoever is master next."""
        ...

    def set_sync_set(self, ids: frozenset[int]) -> None:
        """Master: the replicas whose acknowledgement a send waits for."""
        ...

    def lagging(self, max_ms: int) -> frozenset[int]:
        """Master: syncSet slaves whose acked offset has not reached the end for max_ms."""
        ...

    def caught_up(self) -> frozenset[int]:
        """Master: streaming slaves whose acked offset is at least the confirm offset."""
        ...
