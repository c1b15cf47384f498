// autoheal-gpu-device-plugin: a Kubernetes device plugin for the lab's simulated GPUs.
//
// It advertises nvidia.com/gpu to the kubelet of one real lab node, the way NVIDIA's device plugin
// does on a GPU node, and hands each container the device files of the GPUs it was given (character
// devices the lab creates; they behave as /dev/null) plus NVIDIA_VISIBLE_DEVICES. A GPU turns
// Unhealthy when the GPU fleet simulator holds a critical XID for it, so the kubelet stops offering
// it, as with a GPU that fell off the bus. The simulator's state file is read rather than its HTTP
// API because the plugin runs in the node's network namespace, where the host's loopback is not.
//
// The plugin registers through the kubelet's registration socket and registers again whenever that
// socket is re-created (a restarted kubelet forgets its plugins).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// XIDs that NVIDIA's device plugin treats as application errors: they leave the GPU healthy.
var applicationXIDs = map[int]bool{13: true, 31: true, 43: true, 45: true, 68: true, 109: true}

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	node     string
	gpus     int
	devDir   string
	state    string
	interval time.Duration
}

// health reads the simulator's state file: {"nodes": {...}, "xids": [[node, gpu, xid], ...],
// "lost": [[node, gpu], ...]}: a GPU with a critical XID, or one that vanished, is Unhealthy.
func (p *plugin) health() []string {
	out := make([]string, p.gpus)
	for i := range out {
		out[i] = pluginapi.Healthy
	}
	data, err := os.ReadFile(p.state)
	if err != nil {
		return out // no simulator state yet: every GPU is healthy
	}
	var st struct {
		Xids [][]json.RawMessage `json:"xids"`
		Lost [][]json.RawMessage `json:"lost"`
	}
	if json.Unmarshal(data, &st) != nil {
		return out
	}
	for _, row := range st.Xids {
		var node string
		var gpu, xid int
		if len(row) != 3 || json.Unmarshal(row[0], &node) != nil || json.Unmarshal(row[1], &gpu) != nil ||
			json.Unmarshal(row[2], &xid) != nil {
			continue
		}
		if node == p.node && gpu >= 0 && gpu < p.gpus && xid != 0 && !applicationXIDs[xid] {
			out[gpu] = pluginapi.Unhealthy
		}
	}
	for _, row := range st.Lost {
		var node string
		var gpu int
		if len(row) == 2 && json.Unmarshal(row[0], &node) == nil && json.Unmarshal(row[1], &gpu) == nil &&
			node == p.node && gpu >= 0 && gpu < p.gpus {
			out[gpu] = pluginapi.Unhealthy
		}
	}
	return out
}

func (p *plugin) devices(health []string) []*pluginapi.Device {
	devs := make([]*pluginapi.Device, p.gpus)
	for i := range devs {
		devs[i] = &pluginapi.Device{ID: fmt.Sprintf("nvidia%d", i), Health: health[i]}
	}
	return devs
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	var last []string
	for {
		h := p.health()
		if !reflect.DeepEqual(h, last) {
			if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices(h)}); err != nil {
				return err
			}
			log.Printf("advertised %d GPUs: %v", p.gpus, h)
			last = h
		}
		select {
		case <-s.Context().Done():
			return nil
		case <-time.After(p.interval):
		}
	}
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		car := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{}}
		var idx []string
		for _, id := range c.DevicesIds {
			n, err := strconv.Atoi(strings.TrimPrefix(id, "nvidia"))
			if err != nil || n < 0 || n >= p.gpus {
				return nil, fmt.Errorf("unknown device %q", id)
			}
			car.Devices = append(car.Devices, &pluginapi.DeviceSpec{
				ContainerPath: "/dev/" + id, HostPath: filepath.Join(p.devDir, id), Permissions: "rw",
			})
			idx = append(idx, strconv.Itoa(n))
		}
		car.Envs["NVIDIA_VISIBLE_DEVICES"] = strings.Join(idx, ",")
		car.Envs["AUTOHEAL_GPU_NODE"] = p.node
		resp.ContainerResponses = append(resp.ContainerResponses, car)
		log.Printf("allocated %v", c.DevicesIds)
	}
	return resp, nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func register(dir, endpoint, resource string) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: resource,
	})
	return err
}

// inode of the kubelet's socket, 0 if absent: a new inode means a restarted kubelet.
func inode(path string) uint64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0
	}
	return st.Ino
}

func main() {
	p := &plugin{}
	flag.StringVar(&p.node, "node", "", "node name (as the simulator knows it)")
	flag.IntVar(&p.gpus, "gpus", 8, "GPUs on this node")
	flag.StringVar(&p.devDir, "dev-dir", "", "directory holding the device files nvidia0..N-1")
	flag.StringVar(&p.state, "simulator-state", "", "the GPU fleet simulator's state file")
	dir := flag.String("plugin-dir", pluginapi.DevicePluginPath, "the kubelet's device plugin directory")
	resource := flag.String("resource", "nvidia.com/gpu", "extended resource name")
	flag.DurationVar(&p.interval, "interval", time.Second, "how often GPU health is read")
	version := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *version {
		fmt.Println("autoheal-gpu-device-plugin v1")
		return
	}
	if p.node == "" || p.devDir == "" || p.gpus < 1 {
		log.Fatal("--node, --dev-dir and --gpus >= 1 are required")
	}
	endpoint := "autoheal-gpu.sock"
	sock := filepath.Join(*dir, endpoint)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	kubelet := filepath.Join(*dir, "kubelet.sock")
	var srv *grpc.Server
	var registered uint64
	for {
		// A starting kubelet deletes every socket in its device-plugin directory, ours included:
		// serve again on a fresh socket and register, whenever the kubelet's socket is new.
		if ino := inode(kubelet); ino != 0 && ino != registered {
			if srv != nil {
				srv.Stop()
			}
			var err error
			if srv, err = serve(p, sock); err != nil {
				log.Fatalf("listen %s: %v", sock, err)
			}
			if err := register(*dir, endpoint, *resource); err != nil {
				log.Printf("registering with the kubelet: %v (retrying)", err)
			} else {
				log.Printf("registered %s (%d GPUs) with the kubelet of %s", *resource, p.gpus, p.node)
				registered = ino
			}
		}
		select {
		case <-stop:
			if srv != nil {
				srv.Stop()
			}
			_ = os.Remove(sock)
			return
		case <-time.After(time.Second):
		}
	}
}

func serve(p *plugin, sock string) (*grpc.Server, error) {
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(lis) }()
	return srv, nil
}
