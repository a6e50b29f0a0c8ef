"""The broker: composition root (app.py), config, topic/group/offset tables, client registry,
long polling, flush service, name-server registration and the request handlers."""
