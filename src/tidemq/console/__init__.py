"""The web console (`tidemq console`): server-rendered pages over the admin protocol.

Like rocketmq-dashboard, it holds no state of its own and reaches the cluster only as a client:
one `tidemq.client.admin.Admin` started with the app and closed with it. `reads.py` gathers what
a page shows (each page under one deadline, every table capped), `actions.py` holds the three
writes (reset offsets, delete a group, resend a message), each behind a confirmation step, and
`app.py` wires them to starlette routes and jinja2 templates. The live charts poll a JSON
endpoint with cumulative counters; the browser's own small script (static/console.js) draws
their rate of change on a <canvas>.
"""
