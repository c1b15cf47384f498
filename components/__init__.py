"""Pulumi ComponentResources of autoheal, one module (or package) per component.

* `cluster.KubernetesCluster`: the cluster (kubeconfig or EKS) as one Kubernetes provider.
* `nodepool.GpuNodePool`: a declared GPU pool (size, spares, GPU model, labels, taints).
* `slurm.SlurmCluster`: Slurm on Kubernetes, built from child components that read like the
  architecture: `SlurmConfig`, `SlurmSharedStorage`, `SlurmController`, `SlurmLogin` and one
  `SlurmWorkers` per pool.
* `monitoring.GpuMonitoring`: dcgm-exporter, XID alert rules, the route to the runner.
* `runner.RemediationRunner`: the webhook runner with least-privilege RBAC and its token.

Components take plain dataclass arguments and never read `pulumi.Config`; `config` validates the
stack configuration and `stack.build_stack` wires the components for `__main__.py`. `common` and
`kube` hold the small shared builders; label and annotation keys come from `autoheal.labels`.
Nothing is imported here, so `import components.config` stays cheap.
"""
