"""The StorageClasses the stack's volumes ask for: each one named exists, and a default class
where a volume names none."""

from __future__ import annotations

from components.config import StackSpec
from components.preflight.model import Check, ClusterView
from components.preflight.objects import listed, name_of

DEFAULT_CLASS_ANNOTATIONS = (
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
)


def _storage_wants(cfg: StackSpec) -> dict[str | None, list[str]]:
    """StorageClass name (None: the default) -> the config keys whose volumes use it."""
    wants: dict[str | None, list[str]] = {}
    st = cfg.slurm.storage
    wants.setdefault(st.state_storage_class, []).append("slurm.storage.stateStorageClass")
    wants.setdefault(st.shared_storage_class, []).append("slurm.storage.sharedStorageClass")
    if st.checkpoint_storage_class is not None:  # unset: checkpoints share the shared class
        wants.setdefault(st.checkpoint_storage_class, []).append("slurm.storage.checkpointStorageClass")
    if cfg.runner.journal == "sqlite":  # a PostgreSQL journal has no volume of ours
        wants.setdefault(cfg.runner.journal_storage_class, []).append("runner.journalStorageClass")
    return wants


def check_storage(cfg: StackSpec, view: ClusterView) -> list[Check]:
    if view.storage_classes is None:
        return [
            view.unlisted(
                "storage classes",
                "StorageClasses",
                "storageclasses",
                "storage.k8s.io",
                "let the kubeconfig's user list storageclasses (storage.k8s.io)",
            )
        ]
    by_name = {name_of(sc): sc for sc in view.storage_classes}
    defaults = sorted(
        name_of(sc)
        for sc in view.storage_classes
        if any(
            (sc.get("metadata", {}).get("annotations") or {}).get(a) == "true"
            for a in DEFAULT_CLASS_ANNOTATIONS
        )
    )
    have = listed(by_name) if by_name else "none"
    out = []
    for wanted, keys in _storage_wants(cfg).items():
        used_by = ", ".join(keys)
        if wanted is None:
            if defaults:
                out.append(Check("storage: default class", "pass", f"{defaults[0]} (for {used_by} unset)"))
            else:
                out.append(
                    Check(
                        "storage: default class",
                        "fail",
                        f"no default StorageClass, and {used_by} name none (StorageClasses here: {have})",
                        "mark one default (kubectl annotate storageclass <name> "
                        "storageclass.kubernetes.io/is-default-class=true) or name one in those keys",
                    )
                )
        elif wanted in by_name:
            provisioner = by_name[wanted].get("provisioner", "?")
            out.append(Check(f"storage: {wanted}", "pass", f"provisioner {provisioner} (for {used_by})"))
        else:
            out.append(
                Check(
                    f"storage: {wanted}",
                    "fail",
                    f"StorageClass {wanted} (named by {used_by}) does not exist; StorageClasses here: {have}",
                    f"create StorageClass {wanted} (install its CSI driver) "
                    f"or name an existing one in {used_by}",
                )
            )
    return out
