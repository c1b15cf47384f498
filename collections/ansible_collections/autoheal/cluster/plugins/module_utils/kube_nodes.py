# -*- coding: utf-8 -*-
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""Patching a batch of Kubernetes nodes (cordon, labels, annotations, taints), shared by the
k8s_nodes and fence modules.

`apply` is k8s_nodes' whole behaviour after its arguments are checked: per node, read, work out the
wanted labels/annotations/taints/cordon, and send one merge patch carrying the resourceVersion it
read (a conflict is re-read and retried). It raises NodesError (with the result) instead of calling
fail_json, so the fence module can run it in a thread.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy

from ansible_collections.autoheal.cluster.plugins.module_utils.kube import KubeError

OWNER = "autoheal"
QUARANTINE_TAINT = "autoheal.io/quarantine"
STATE_LABEL = "autoheal.io/state"
INCIDENT_ANNOTATION = "autoheal.io/incident"
CORDON_OWNER_ANNOTATION = "autoheal.io/cordoned-by"


class NodesError(Exception):
    def __init__(self, msg, result):
        Exception.__init__(self, msg)
        self.msg = msg
        self.result = result


def view(node):
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    return dict(unschedulable=bool(spec.get("unschedulable")), labels=dict(meta.get("labels") or {}),
                annotations=dict(meta.get("annotations") or {}), taints=list(spec.get("taints") or []))


def desired(cur, name, p):
    """Return (new view, skipped reasons) for one node."""
    new = copy.deepcopy(cur)
    skipped = []
    owner_key = p["cordon_owner_annotation"]
    for k, v in (p["labels"] or {}).items():
        if v is None:
            new["labels"].pop(k, None)
        else:
            new["labels"][k] = str(v)
    ann = dict(p["annotations"] or {})
    ann.update((p["node_annotations"] or {}).get(name) or {})
    for k, v in ann.items():
        if v is None:
            new["annotations"].pop(k, None)
        else:
            new["annotations"][k] = str(v)
    if p["cordon"] is True and not cur["unschedulable"]:
        new["unschedulable"] = True
        new["annotations"][owner_key] = OWNER
    elif p["cordon"] is False and cur["unschedulable"]:
        if cur["annotations"].get(owner_key) == OWNER or not p["cordon_owned_only"]:
            new["unschedulable"] = False
            new["annotations"].pop(owner_key, None)
        else:
            skipped.append(dict(node=name, what="uncordon", reason="cordoned by someone else"))
    taints = [t for t in new["taints"]]
    for t in p["taints"] or []:
        if t["state"] == "absent":
            taints = [x for x in taints if not (x.get("key") == t["key"]
                                                 and (not t.get("effect") or x.get("effect") == t["effect"]))]
        else:
            if not t.get("effect"):
                raise ValueError("taint %s: effect is required with state=present" % t["key"])
            want = dict(key=t["key"], effect=t["effect"])
            if t.get("value") is not None:
                want["value"] = t["value"]
            same = [x for x in taints if x.get("key") == t["key"] and x.get("effect") == t["effect"]]
            if not same or any(x.get("value") != want.get("value") for x in same):
                taints = [x for x in taints if not (x.get("key") == t["key"] and x.get("effect") == t["effect"])]
                taints.append(want)
    # Kubernetes adds timeAdded to NoExecute taints; compare without it.
    new["taints"] = taints
    return new, skipped


def strip(taints):
    return sorted((t.get("key"), t.get("value"), t.get("effect")) for t in taints)


def same(a, b):
    return (a["unschedulable"] == b["unschedulable"] and a["labels"] == b["labels"]
            and a["annotations"] == b["annotations"] and strip(a["taints"]) == strip(b["taints"]))


def merge_patch(cur, new, rv):
    meta = {"resourceVersion": rv}
    labels = dict((k, v) for k, v in new["labels"].items() if cur["labels"].get(k) != v)
    labels.update((k, None) for k in cur["labels"] if k not in new["labels"])
    anns = dict((k, v) for k, v in new["annotations"].items() if cur["annotations"].get(k) != v)
    anns.update((k, None) for k in cur["annotations"] if k not in new["annotations"])
    if labels:
        meta["labels"] = labels
    if anns:
        meta["annotations"] = anns
    spec = {}
    if new["unschedulable"] != cur["unschedulable"]:
        spec["unschedulable"] = new["unschedulable"] or None
    if strip(new["taints"]) != strip(cur["taints"]):
        spec["taints"] = new["taints"] or None
    body = {"metadata": meta}
    if spec:
        body["spec"] = spec
    return body


def apply(module, kube, names, p):
    """Patch `names` as `p` asks (the k8s_nodes options); returns the result."""
    def handle(name):
        for attempt in range(6):
            # The first read comes from the watch cache and is trusted only for a patch, which
            # carries its resourceVersion; "missing" or "nothing to change" is read again.
            cached = attempt == 0
            node = kube.get_node(name, cached=cached)
            if node is None:
                if cached:
                    continue
                return dict(missing=True)
            cur = view(node)
            new, skipped = desired(cur, name, p)
            if same(cur, new):
                if cached:
                    continue
                return dict(changed=False, before=cur, after=cur, skipped=skipped)
            if module.check_mode:
                return dict(changed=True, before=cur, after=new, skipped=skipped)
            body = merge_patch(cur, new, node["metadata"].get("resourceVersion"))
            try:
                patched = kube.patch_node(name, body)
            except KubeError as exc:
                if exc.status == 409:  # someone else wrote the node meanwhile: recompute
                    continue
                raise
            return dict(changed=True, before=cur, after=view(patched), skipped=skipped)
        raise KubeError(409, "node %s kept changing under us (5 conflicts)" % name)

    res = kube.map(handle, names)
    result = dict(changed=False, changed_nodes=[], unchanged_nodes=[], skipped_nodes=[], missing_nodes=[],
                  nodes_after={}, errors={})
    diff_before, diff_after = {}, {}
    for name in names:
        out, err = res[name]
        if err:
            result["errors"][name] = err
            continue
        if out.get("missing"):
            result["missing_nodes"].append(name)
            continue
        result["skipped_nodes"].extend(out["skipped"])
        result["nodes_after"][name] = out["after"]
        if out["changed"]:
            result["changed"] = True
            result["changed_nodes"].append(name)
            diff_before[name] = out["before"]
            diff_after[name] = out["after"]
        else:
            result["unchanged_nodes"].append(name)
    if module._diff and result["changed"]:
        result["diff"] = dict(before=diff_before, after=diff_after)
    if result["errors"]:
        raise NodesError("Kubernetes API errors: %s" % result["errors"], result)
    if result["missing_nodes"] and not p["allow_missing"]:
        raise NodesError("nodes not found in Kubernetes: %s" % ", ".join(result["missing_nodes"]), result)
    return result
