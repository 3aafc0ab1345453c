"""The Kafka ACLs docs/security.md recommends, read from the doc's own shell block (so the doc is
what the tests check) and put on a broker through fleetwatch's admin client (`Admin.allow`).

The block calls `acl --allow-principal User:NAME --operation OP ... (--topic T | --group G |
--cluster)`, some inside `for` loops; bash runs it with `acl` defined to print its arguments, and
each call becomes one ALLOW binding per operation."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import NamedTuple

from fleetwatch.bus.admin import Admin

# the doc's block, and the doc's own definition of acl() in it (replaced by one that prints)
_BLOCK = re.compile(r"## Kafka ACLs we recommend.*?```sh\n(.*?)```", re.S)
_DOC_ACL = re.compile(r"^acl\(\) \{.*\n", re.M)
_PRINT_ACL = 'acl() { printf "%s\\0" "$@"; printf "\\n\\0"; }\n'


class Grant(NamedTuple):
    principal: str  # "User:detect"
    operation: str  # as kafka-acls.sh spells it: "Read", "IdempotentWrite"
    resource: str  # "topic", "group", "cluster"
    name: str  # the topic's or group's name; "kafka-cluster" for the cluster


def recommended_grants(doc: Path) -> list[Grant]:
    """Every grant of the doc's ACL block."""
    found = _BLOCK.search(doc.read_text(encoding="utf-8"))
    if found is None:
        raise ValueError(f"{doc}: no '## Kafka ACLs we recommend' section with a sh block")
    script = _PRINT_ACL + _DOC_ACL.sub("", found.group(1))
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True, timeout=30).stdout
    grants: list[Grant] = []
    for call in out.decode().split("\n\0"):
        args = [a for a in call.split("\0") if a]
        if not args:
            continue
        if args[:1] != ["--allow-principal"] or len(args) < 2:
            raise ValueError(f"an acl call this reader does not know: {args}")
        principal, ops, resource, name = args[1], [], "", ""
        rest = iter(args[2:])
        for flag in rest:
            if flag == "--operation":
                ops.append(next(rest))
            elif flag in ("--topic", "--group"):
                resource, name = flag[2:], next(rest)
            elif flag == "--cluster":
                resource, name = "cluster", "kafka-cluster"
            else:
                raise ValueError(f"an acl flag this reader does not know: {flag}")
        grants += [Grant(principal, op, resource, name) for op in ops]
    return grants


def apply_grants(bootstrap: str, grants: list[Grant]) -> None:
    """Create the grants as ALLOW ACLs (idempotent), with the broker's admin credentials."""
    with Admin(bootstrap) as admin:
        admin.allow(grants)
