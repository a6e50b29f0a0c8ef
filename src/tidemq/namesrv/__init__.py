"""The name server: a route table rebuilt from broker registrations, served over remoting."""

from __future__ import annotations

from tidemq.namesrv.app import NamesrvApp
from tidemq.namesrv.config import NamesrvConfig
from tidemq.namesrv.route_table import RouteTable

__all__ = ["NamesrvApp", "NamesrvConfig", "RouteTable"]
