# -*- coding: utf-8 -*-
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""Small filters that keep the runbooks' Jinja readable."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: node_map
short_description: Pair node names with a parallel list of values
description:
  - >-
    C(nodes | autoheal.cluster.node_map(values, default)) returns C({node: value}); nodes past the
    end of O(values) get O(default).
  - >-
    C(nodes | autoheal.cluster.phase_events(incidents, phase, status, ts, detail)) returns journal
    events C([{incident, node, phase, status, ts, detail}]) where O(incidents) is a C({node: id}) map
    and O(detail) a string or a C({node: text}) map.
  - >-
    C(nodes | autoheal.cluster.jobs_by_node(jobs, ids)) returns C({node: [job ids]}) from the
    C(jobs) list returned by M(autoheal.cluster.slurm_jobs); with O(ids) only those job ids count.
options:
  _input:
    description: Node names.
    type: list
    elements: str
    required: true
"""

import time


def node_map(nodes, values, default=None):
    values = list(values or [])
    return dict((n, values[i] if i < len(values) else default) for i, n in enumerate(nodes or []))


def phase_events(nodes, incidents, phase, status="ok", ts=None, detail=None):
    incidents = incidents or {}
    stamp = float(ts) if ts not in (None, "") else time.time()
    out = []
    for n in nodes or []:
        d = detail.get(n) if isinstance(detail, dict) else detail
        ev = dict(incident=str(incidents.get(n) or "manual"), node=n, phase=phase,
                  status=status(n) if callable(status) else status, ts=stamp)
        if d not in (None, "", [], {}):
            ev["detail"] = d if isinstance(d, str) else str(d)
        out.append(ev)
    return out


def jobs_by_node(nodes, jobs, ids=None):
    """{node: [job ids]} for the jobs (slurm_jobs `jobs` records) that ran on each node; with
    `ids`, only those job ids count."""
    wanted = None if ids is None else set(int(i) for i in ids)
    out = dict((n, []) for n in nodes or [])
    for job in jobs or []:
        if wanted is not None and int(job["job_id"]) not in wanted:
            continue
        for n in job.get("nodes") or []:
            if n in out:
                out[n].append(job["job_id"])
    return out


class FilterModule(object):
    def filters(self):
        return {"node_map": node_map, "phase_events": phase_events, "jobs_by_node": jobs_by_node}
