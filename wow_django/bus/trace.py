"""Call chains (seed 004 §6.2): the events of one trace as a time line and as a parent → child tree."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class TraceNode:
    event: dict
    children: list[TraceNode] = field(default_factory=list)

    def to_json(self, render: Callable[[dict], dict]) -> dict:
        return {**render(self.event), "children": [child.to_json(render) for child in self.children]}


def build_tree(events: list[dict]) -> list[TraceNode]:
    """Roots (no parent, or a parent outside ``events``) with their children, in the order given.

    A malformed chain (an event that is its own ancestor) cannot loop: each
    event is placed once, under the first parent reached from a root; events
    only reachable through a cycle become roots.
    """
    nodes = {event["eventId"]: TraceNode(event) for event in events}
    children: dict[str, list[str]] = {}
    roots: list[str] = []
    for event in events:
        parent = event.get("parentEventId")
        if parent and parent in nodes and parent != event["eventId"]:
            children.setdefault(parent, []).append(event["eventId"])
        else:
            roots.append(event["eventId"])
    placed: set[str] = set()

    def attach(event_id: str) -> TraceNode:
        placed.add(event_id)
        node = nodes[event_id]
        for child in children.get(event_id, ()):
            if child not in placed:
                node.children.append(attach(child))
        return node

    tree = [attach(root) for root in roots]
    for event in events:  # members of a cycle
        if event["eventId"] not in placed:
            tree.append(attach(event["eventId"]))
    return tree


def render_tree(roots: list[TraceNode], label: Callable[[dict], str]) -> list[str]:
    """Text lines drawing the tree (``├──`` / ``└──``)."""
    lines: list[str] = []

    def walk(node: TraceNode, prefix: str, last: bool, top: bool) -> None:
        if top:
            lines.append(label(node.event))
            child_prefix = ""
        else:
            lines.append(f"{prefix}{'└── ' if last else '├── '}{label(node.event)}")
            child_prefix = prefix + ("    " if last else "│   ")
        for index, child in enumerate(node.children):
            walk(child, child_prefix, index == len(node.children) - 1, False)

    for root in roots:
        walk(root, "", True, True)
    return lines
