"""The group admin APIs of the coordinator (LIST_GROUPS, DESCRIBE_GROUPS, DELETE_GROUPS),
apart from the heartbeat and commit path in ``nodes/group_coordinator.py``, whose
``GroupCoordinator`` they are part of (a mixin: they use its partitions and its writes).

Everything here runs on the node's loop thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fabric import errors
from fabric.protocol import apis
from fabric.wording import plural
from nodes import group_retention
from nodes.admin import check_names
from nodes.group_records import ACTIVE, Partition
from nodes.group_state import GroupState


class GroupAdminApis:
    """The admin APIs; ``GroupCoordinator`` provides what is declared below."""

    _partitions: dict[int, Partition]
    _send: Callable[[list[Any], list[Any]], object]

    def _partition_for(self, group_id: str) -> Partition:
        raise NotImplementedError

    def _write(self, part: Partition, records: list[tuple[bytes, bytes | None]],
               on_done: Callable[[int, str], None], *, restating: bool = False,
               timestamps_ms: list[int] | None = None) -> None:
        raise NotImplementedError

    def _after_writes(self, part: Partition, callback: Callable[[int, str], None]) -> None:
        raise NotImplementedError

    def _reply(self, envelope: list[Any], request: apis.Message, body: dict[str, Any]) -> None:
        raise NotImplementedError

    def _list_groups(self) -> dict[str, Any]:
        groups = [{"group_id": g.group_id, "state": g.state(), "members": len(g.members)}
                  for part in self._partitions.values() if part.mode == ACTIVE for g in part.groups.values()]
        return {"error": 0, "groups": sorted(groups, key=lambda g: g["group_id"])}

    def _describe_groups(self, group_ids: list[str]) -> dict[str, Any]:
        check_names(group_ids, "group_ids")
        out = []
        # A group asked for twice is answered once (as METADATA): 100,000 copies of one
        # group id made its coordinator describe it 100,000 times (17 MB, 3 s of its loop
        # for a one-member group; a member more, as much again).
        for group_id in dict.fromkeys(group_ids):
            try:
                group = self._partition_for(group_id).groups.get(group_id)
            except errors.FabricError as exc:
                out.append(GroupState.not_described(group_id, exc.code))
                continue
            out.append(group.describe() if group is not None
                       else GroupState.not_described(group_id, errors.GroupIdNotFoundError.code))
        return {"groups": out}

    def _delete_groups(self, envelope: list[Any], request: apis.Message) -> None:
        results: list[dict[str, Any]] = []
        waits: list[Partition] = []
        check_names(request.body["group_ids"], "group_ids")
        for group_id in request.body["group_ids"]:
            try:
                part = self._partition_for(group_id)
            except errors.FabricError as exc:
                results.append({"group_id": group_id, "error": exc.code, "message": exc.message})
                continue
            group = part.groups.get(group_id)
            if group is None:
                results.append({"group_id": group_id, "error": errors.GroupIdNotFoundError.code, "message": ""})
                continue
            if not group.is_empty():
                results.append({"group_id": group_id, "error": errors.GroupNotEmptyError.code,
                                "message": f"group {group_id!r} has {plural(len(group.members), 'live member')}"})
                continue
            del part.groups[group_id]
            self._write(part, group_retention.tombstones(group), lambda _c, _t: None)
            results.append({"group_id": group_id, "error": 0, "message": ""})
            waits.append(part)
        self._answer_after_all(envelope, request, {"results": results}, waits)

    def _answer_after_all(self, envelope: list[Any], request: apis.Message, body: dict[str, Any],
                          parts: list[Partition]) -> None:
        remaining = [len(parts)]
        failed: list[tuple[int, str]] = []

        def one_done(code: int, text: str) -> None:
            if code:
                failed.append((code, text))
            remaining[0] -= 1
            if remaining[0] == 0:
                if failed:
                    self._send(envelope, apis.encode_error_response(request.header, failed[0][0], failed[0][1]))
                else:
                    self._reply(envelope, request, body)

        if not parts:
            self._reply(envelope, request, body)
        for part in parts:
            self._after_writes(part, one_done)
