# The lab's Kubernetes device plugin for simulated GPUs (main.go): advertises nvidia.com/gpu to a
# real node's kubelet and hands containers the simulator's device files.
VERSION=v1
BINS=(autoheal-gpu-device-plugin)
COLD_SECONDS=10

build() {
  go build -p "$GO_PROCS" -ldflags="-s -w" -o "$OUT/autoheal-gpu-device-plugin" .
  "$OUT/autoheal-gpu-device-plugin" --version
}
