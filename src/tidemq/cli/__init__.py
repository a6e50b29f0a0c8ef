"""The `tidemq` command: server processes (namesrv, broker, dev), admin verbs and store tools."""
