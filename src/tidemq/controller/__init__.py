"""The failover controller (issue 14): a broker group's master, epoch and in-sync set in etcd.

There is no controller process: every broker of a group runs a GroupMember, and etcd is the
consensus; each change of master, epoch or syncSet is one compare-and-swap on the state key.

    state.py   GroupState, AliveRecord, key names, truncation_point    (pure values)
    etcd.py    EtcdSession: bounded calls, CAS, leases, re-watching    (aetcd, v3 gRPC API)
    lease.py   LeaseKeeper: keep-alive and the fencing deadline valid_until
    member.py  GroupMember: the state machine
    replica.py Replica: the protocol the broker implements for its member
    rules.py   when a member may create the state, stand, or finish a won election (pure)
"""
