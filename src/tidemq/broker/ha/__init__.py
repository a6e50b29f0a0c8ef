"""Replication (issue 13): a master streams its commit log to slaves of the same brokerName.

    HAMaster (master.py)   serves slaves on haListenPort; SYNC_MASTER sends wait on its acks
    HASlave  (slave.py)    follows the master the name server names; appends to its store
    AckWaiters (acks.py)   the group release of SYNC sends' waits
    InSync (in_sync.py)    controller mode: acks wait for the sync set (and slaves joining it)
    SlaveInfo, LagSamples (lag.py)   what the master reports of each slave, its lag in ms
    HASettings (settings.py)

The wire is protocol/ha.py; the store's side is store/replica.py.
"""

from tidemq.broker.ha.lag import SlaveInfo
from tidemq.broker.ha.master import HAMaster
from tidemq.broker.ha.settings import HASettings
from tidemq.broker.ha.slave import HASlave, SlaveState

__all__ = ["HAMaster", "HASettings", "HASlave", "SlaveInfo", "SlaveState"]
