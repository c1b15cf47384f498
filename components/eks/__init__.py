"""The AWS side of an EKS stack, in small parts: IAM (roles, the cluster's OIDC provider and
IAM roles for ServiceAccounts), node groups (the system group, EFA launch templates), the managed
add-ons, storage (CSI drivers, EFS, StorageClasses) and EksPlatform, which puts them together with
the Kubernetes objects an EKS cluster needs before autoheal's own workloads can run.

`pulumi_aws` is a big package: these modules import it inside functions, so a stack on the
kubeconfig backend (the lab) never loads it.
"""
