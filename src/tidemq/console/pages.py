"""The console's page handlers: each gathers with reads.py (or writes with actions.py) and
renders one template. The confirm steps: a write happens only on a POST whose form says
confirm=yes; anything else shows what would be done."""

from __future__ import annotations

import asyncio
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tidemq.client.admin import Admin
from tidemq.errors import QueueError
from tidemq.protocol import message as pm

from . import actions, reads
from .core import PAGE_TIMEOUT_S, BadInput, Console, number, parse_time, time_field

# A query by time without a start looks this far back from its end (or now): the last hour.
QUERY_SPAN_MS_DEFAULT: Final = 3_600_000


class Handlers:
    def __init__(self, console: Console) -> None:
        self._c = console

    # -- cluster, brokers ----------------------------------------------------------------------

    async def cluster(self, request: Request) -> Response:
        async def build(admin: Admin) -> dict[str, Any]:
            rows = await reads.brokers(admin)
            return {"brokers": rows, "live": ("cluster", "")}

        return await self._c.page(request, "cluster.html", build)

    async def broker(self, request: Request) -> Response:
        addr = request.path_params["addr"]

        async def build(admin: Admin) -> dict[str, Any]:
            row = await reads.broker(admin, addr)
            return {"b": row, "config": await admin.broker_config(addr)}

        return await self._c.page(request, "broker.html", build)

    # -- topics --------------------------------------------------------------------------------

    async def topics(self, request: Request) -> Response:
        async def build(admin: Admin) -> dict[str, Any]:
            names = await admin.topic_list()
            return {"page": reads.paginate(names, number(request))}

        return await self._c.page(request, "topics.html", build)

    async def topic(self, request: Request) -> Response:
        topic = request.path_params["topic"]

        async def build(admin: Admin) -> dict[str, Any]:
            route = await reads.route(admin, topic)
            queues = await reads.topic_queues(admin, topic)
            return {
                "topic": topic,
                "route": route,
                "page": reads.paginate(queues, number(request)),
                "total_messages": sum(q.max_offset - q.min_offset for q in queues),
                "groups": await admin.topic_consumers(topic),
                "live": ("topic", topic),
            }

        return await self._c.page(request, "topic.html", build)

    # -- groups --------------------------------------------------------------------------------

    async def groups(self, request: Request) -> Response:
        async def build(admin: Admin) -> dict[str, Any]:
            return {"page": reads.paginate(await admin.groups(), number(request))}

        return await self._c.page(request, "groups.html", build)

    async def group(self, request: Request) -> Response:
        group = request.path_params["group"]

        async def build(admin: Admin) -> dict[str, Any]:
            offsets = await reads.group_offsets(admin, group)
            clients = await reads.group_clients(admin, group)
            if not offsets and not clients and group not in await admin.groups():
                raise reads.NotFound("group", group)
            return {
                "group": group,
                "page": reads.paginate(offsets, number(request)),
                "lag": sum(r.lag for r in offsets),
                "topics": sorted({r.queue.topic for r in offsets}),
                "clients": reads.paginate(clients, number(request, "cpage")),
                "live": ("group", group),
            }

        return await self._c.page(request, "group.html", build)

    async def reset(self, request: Request) -> Response:
        step = await self._c.write_form(request)
        if step.refused is not None:
            return step.refused
        group = request.path_params["group"]
        topic = step.fields.get("topic", "").strip()
        when = time_field(step.fields, "time")

        async def build(admin: Admin) -> dict[str, Any]:
            context: dict[str, Any] = {"group": group, "topic": topic, "time": when}
            if not topic or not when:
                offsets = await reads.group_offsets(admin, group)
                context["topics"] = sorted({r.queue.topic for r in offsets})
                return context
            ms = parse_time(when)
            context["ms"] = ms
            if step.confirmed:
                context["done"] = await actions.reset_apply(admin, group, topic, ms)
            else:
                context["plan"] = await actions.reset_plan(admin, group, topic, ms)
                context["clients"] = await reads.group_clients(admin, group)
            return context

        return await self._c.page(request, "reset.html", build, writes=step.confirmed)

    async def delete(self, request: Request) -> Response:
        step = await self._c.write_form(request)
        if step.refused is not None:
            return step.refused
        group = request.path_params["group"]

        async def build(admin: Admin) -> dict[str, Any]:
            if step.confirmed:
                return {"group": group, "done": await actions.delete_group(admin, group)}
            if group not in await admin.groups():
                raise reads.NotFound("group", group)
            return {"group": group}

        return await self._c.page(request, "delete.html", build, writes=step.confirmed)

    # -- messages ------------------------------------------------------------------------------

    async def messages(self, request: Request) -> Response:
        q = request.query_params

        async def build(admin: Admin) -> dict[str, Any]:
            context: dict[str, Any] = {"q": q, "found": None}
            topic = q.get("topic", "").strip()
            if q.get("by") == "time" and topic:
                end_text, begin_text = time_field(q, "end"), time_field(q, "begin")
                end = parse_time(end_text) if end_text else self._c.clock.now_ms()
                begin = parse_time(begin_text) if begin_text else end - QUERY_SPAN_MS_DEFAULT
                context["span"] = (begin, end)
                context["found"] = await reads.messages_by_time(admin, topic, begin, end)
            elif q.get("by") == "key" and topic and q.get("key"):
                context["found"] = await reads.messages_by_key(admin, topic, q["key"].strip())
            elif q.get("by") == "id" and q.get("id"):
                context["found"] = [await reads.message_by_id(admin, q["id"].strip(), topic)]
            return context

        return await self._c.page(request, "messages.html", build)

    async def message(self, request: Request) -> Response:
        msg_id = request.query_params.get("id", "")
        topic = request.query_params.get("topic", "")

        async def build(admin: Admin) -> dict[str, Any]:
            message = await reads.message_by_id(admin, msg_id, topic)
            return {
                "m": message,
                "body": reads.Body.of(message.body),
                "groups": await admin.groups(),
            }

        return await self._c.page(request, "message.html", build)

    async def resend(self, request: Request) -> Response:
        step = await self._c.write_form(request)
        if step.refused is not None:
            return step.refused
        msg_id, group = step.fields.get("id", ""), step.fields.get("group", "").strip()

        async def build(admin: Admin) -> dict[str, Any]:
            if not group:
                raise BadInput("No group to resend to.")
            message = await reads.message_by_id(admin, msg_id, step.fields.get("topic", ""))
            context: dict[str, Any] = {"m": message, "group": group}
            if step.confirmed:
                context["sent"] = await actions.resend(admin, message, group)
            else:
                context["retry_topic"] = pm.retry_topic(group)
                context["origin"] = actions.retry_topic_of(message)
            return context

        return await self._c.page(request, "resend.html", build, writes=step.confirmed)

    # -- dead letters, transactions --------------------------------------------------------------

    async def dlq(self, request: Request) -> Response:
        async def build(admin: Admin) -> dict[str, Any]:
            return {"page": reads.paginate(await reads.dlq_groups(admin), number(request))}

        return await self._c.page(request, "dlq.html", build)

    async def dlq_group(self, request: Request) -> Response:
        group = request.path_params["group"]

        async def build(admin: Admin) -> dict[str, Any]:
            letters, total = await reads.dead_letters(admin, group)
            return {"group": group, "letters": letters, "total": total}

        return await self._c.page(request, "dlq_group.html", build)

    async def transactions(self, request: Request) -> Response:
        async def build(admin: Admin) -> dict[str, Any]:
            return {"brokers": await reads.transactions(admin)}

        return await self._c.page(request, "transactions.html", build)

    async def counters(self, request: Request) -> Response:
        kind = request.query_params.get("kind", "cluster")
        name = request.query_params.get("name", "")
        try:
            async with asyncio.timeout(PAGE_TIMEOUT_S):
                values = await reads.counters(self._c.admin, kind, name)
        except reads.NotFound as missing:
            return JSONResponse({"error": str(missing)}, status_code=404)
        except (QueueError, TimeoutError) as error:
            return JSONResponse({"error": str(error) or "timeout"}, status_code=502)
        return JSONResponse({"t": self._c.clock.now_ms(), "series": values})
