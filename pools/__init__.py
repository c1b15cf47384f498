"""Pool backends: how a GPU pool's nodes are rebooted and retired on the infrastructure that runs
them (a cloud's API, a Kubernetes-native node lifecycle, the lab's pool controller).

The runbook's node_pool and ladder roles call them through `autoheal pool ...` (pools/cli.py); the
interface every backend implements is pools/base.py. One backend per pool, declared in the stack
(`pools[].backend`) and written into the pool's description (pool.json).
"""
