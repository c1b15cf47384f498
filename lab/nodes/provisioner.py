"""A dynamic volume provisioner for the lab's real nodes: PVCs bind as they would on a cloud.

    python -m lab.nodes.provisioner --kubeconfig K --root DIR

It follows the external-provisioner contract (as Kubernetes' local-path and sig-storage hostpath
provisioners do): a default StorageClass names it; for every Pending claim of that class it
creates a PersistentVolume with a `claimRef` to the claim and `pv.kubernetes.io/provisioned-by`
set to its name, and the controller manager's real PV controller binds the two. When a claim is
deleted, the controller marks its volume Released and leaves the deletion to the provisioner
named on it: this one removes the directory and the PersistentVolume.

A volume is a directory under DIR, mounted as a hostPath. All real nodes of a lab share the host's
filesystem, so one directory is the same volume on every node: ReadWriteMany holds, as with NFS.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any

import httpx

from lab import controlplane

PROVISIONER = "autoheal.io/lab-hostpath"
STORAGE_CLASS = "lab-hostpath"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"


def storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            # the default: claims that name no class (as the SlurmCluster's do by default) get it
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def ensure_storage_class(http: httpx.Client) -> None:
    r = http.post("/apis/storage.k8s.io/v1/storageclasses", json=storage_class())
    if r.status_code not in (201, 409):
        raise RuntimeError(
            f"provisioner: creating StorageClass {STORAGE_CLASS}: {r.status_code} {r.text[:300]}"
        )


def volume_for(claim: dict[str, Any], root: Path) -> dict[str, Any]:
    """The PersistentVolume that satisfies `claim`, pre-bound to it by claimRef."""
    meta, spec = claim["metadata"], claim["spec"]
    uid = meta["uid"]
    path = root / f"{meta['namespace']}-{meta['name']}-{uid[:8]}"
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"pvc-{uid}", "annotations": {PROVISIONED_BY: PROVISIONER}},
        "spec": {
            "capacity": {"storage": spec["resources"]["requests"]["storage"]},
            "accessModes": spec["accessModes"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": STORAGE_CLASS,
            "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": uid,
            },
        },
    }


def _claims_to_provision(http: httpx.Client) -> list[dict[str, Any]]:
    r = http.get("/api/v1/persistentvolumeclaims")
    r.raise_for_status()
    return [
        c
        for c in r.json()["items"]
        if c["spec"].get("storageClassName") == STORAGE_CLASS
        and not c["spec"].get("volumeName")
        and c.get("status", {}).get("phase") == "Pending"
        and not c["metadata"].get("deletionTimestamp")
    ]


def sync(http: httpx.Client, root: Path) -> tuple[int, int]:
    """One pass: provision Pending claims, delete Released volumes. Returns (created, deleted)."""
    created = deleted = 0
    for claim in _claims_to_provision(http):
        pv = volume_for(claim, root)
        # world-writable, as rancher's local-path-provisioner makes them: a hostPath volume gets no
        # fsGroup ownership, and its pods (the runner as Slurm's uid, jobs as the cluster user) write
        volume = Path(pv["spec"]["hostPath"]["path"])
        volume.mkdir(parents=True, exist_ok=True)
        volume.chmod(0o777)
        r = http.post("/api/v1/persistentvolumes", json=pv)
        if r.status_code == 201:
            created += 1
        elif r.status_code != 409:  # 409: made by an earlier pass, not bound yet
            r.raise_for_status()
    r = http.get("/api/v1/persistentvolumes")
    r.raise_for_status()
    for pv in r.json()["items"]:
        ours = pv["metadata"].get("annotations", {}).get(PROVISIONED_BY) == PROVISIONER
        if ours and pv.get("status", {}).get("phase") == "Released":
            shutil.rmtree(pv["spec"]["hostPath"]["path"], ignore_errors=True)
            http.delete(f"/api/v1/persistentvolumes/{pv['metadata']['name']}")
            deleted += 1
    return created, deleted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kubeconfig", type=Path, required=True)
    ap.add_argument("--root", type=Path, required=True, help="where volumes' directories are made")
    ap.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    with controlplane.http_client(args.kubeconfig, pool=2) as http:
        ensure_storage_class(http)
        print(
            f"provisioner {PROVISIONER}: StorageClass {STORAGE_CLASS} (default), volumes in {args.root}",
            flush=True,
        )
        while True:
            try:
                created, deleted = sync(http, args.root)
                if created or deleted:
                    print(f"provisioned {created}, deleted {deleted}", flush=True)
            except httpx.HTTPError as exc:  # the API server restarting: try again next pass
                print(f"provisioner: {exc}", flush=True)
            time.sleep(args.interval)


if __name__ == "__main__":
    main()
