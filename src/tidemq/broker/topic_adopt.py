"""TopicAdopter: a promoted master serves every topic its log holds, even one its copy of the
topic table lacks.

A slave copies its master's topic table every slaveSyncIntervalMs (slave_sync.py), so a topic
created just before a failover can be missing from the new master's table while its messages
(or half messages whose commit the new master writes after a check-back) are in the log. Pulls
of a topic the table lacks answer TOPIC_NOT_EXIST, and the name servers route only topics in the
table. So a controller-mode master adopts such topics:

    start:    every topic with consume queues in the store and no table entry
    dispatch: a record of a topic with no table entry (asked once per topic per put, only for
              topics missing from the table: one dict lookup)

An adopted topic gets as many queues as the highest queue id seen + 1 (at least 1), growing
when a record lands on a higher one: what the log proves, nothing invented; an operator can
widen it with `tidemq topic update`.

Only a controller-mode master adopts. Any other broker recovers its topics from topics.json and
its journal alone (topics.py: every change is on disk before its answer leaves), so a restart
after a kill -9 serves exactly the topics it had answered for. Adoption writes like
auto-creation (journaled at the end of the turn); widening a topic is a put (written at once).
"""

from __future__ import annotations

import dataclasses
import logging

from tidemq.broker.topics import TopicTable
from tidemq.store.types import DispatchEvent

log = logging.getLogger(__name__)


class TopicAdopter:
    def __init__(self, topics: TopicTable) -> None:
        self._topics = topics

    def adopt_all(self, queues: dict[str, list[int]]) -> int:
        """Adopt every topic of `queues` (store.topics_and_queues()) the table lacks."""
        adopted = 0
        for topic, queue_ids in queues.items():
            if topic not in self._topics and queue_ids:
                self._adopt(topic, max(queue_ids))
                adopted += 1
        return adopted

    def wants_topic(self, topic: str) -> bool:
        return topic not in self._topics

    def on_dispatch(self, event: DispatchEvent) -> None:
        self._adopt(event.topic, event.queue_id)

    def _adopt(self, topic: str, queue_id: int) -> None:
        queue_nums = queue_id + 1
        config = self._topics.get(topic)
        if config is None:
            log.warning(
                "topic %s is in the log but not in the topic table (created just before a "
                "failover?): adopted with %d queue(s)",
                topic,
                queue_nums,
            )
            self._topics.ensure(topic, queue_nums)
        elif config.write_queue_nums < queue_nums:
            self._topics.put(
                dataclasses.replace(config, read_queue_nums=queue_nums, write_queue_nums=queue_nums)
            )
