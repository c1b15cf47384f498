// Command pulumi-language-python is a minimal Pulumi language host for Python programs.
//
// Why this exists: the upstream host lives in an untagged nested Go module
// (github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3) that the module proxy
// reachable from our machines does not serve at any version, so it cannot be built here.
// This host implements the part of the LanguageRuntime gRPC service that `pulumi up`,
// `preview` and `destroy` need for a plain Python program: it runs the SDK's own executor
// script (pulumi-language-python-exec, copied from the sdk/v3 module beside this binary)
// with the project's Python interpreter. Plugins are never installed by it: they are expected
// on PATH ("ambient"), which is how autoheal runs Pulumi offline.
//
// It also implements RunPlugin, which the engine uses to start a Python policy pack
// (`pulumi preview --policy-pack DIR`, PulumiPolicy.yaml with `runtime: python`): it runs
// `python -u DIR ARGS...` (the pack's __main__.py; ARGS is the engine address) in the requested
// working directory with the requested environment, and streams the output back; the engine reads
// the analyzer's port from the first line of stdout. InstallDependencies installs nothing (the
// pack shares the project's virtualenv, set up by `pip install -e .`): it only checks the
// interpreter.
//
// Python interpreter, first match wins: $PULUMI_PYTHON_CMD; the `virtualenv` runtime option
// in Pulumi.yaml / PulumiPolicy.yaml (relative to that file's folder); $VIRTUAL_ENV/bin/python;
// python3 on PATH.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	pbempty "google.golang.org/protobuf/types/known/emptypb"

	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
)

// version is set at link time (-X main.version=...).
var version = "3.274.1"

// bailExitCode is what the executor uses after it has shown the user an actionable message.
const bailExitCode = 32

type host struct {
	pulumirpc.UnimplementedLanguageRuntimeServer
	engine string
}

func main() {
	engine := ""
	args := os.Args[1:]
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--tracing" || a == "-tracing":
			i++ // takes a value
		case strings.HasPrefix(a, "-"):
			// --logtostderr, -v=N, -root=..., ...: accepted and ignored.
		default:
			engine = a // the engine address is the last positional argument
		}
	}
	h := &host{engine: engine}
	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Init: func(srv *grpc.Server) error {
			pulumirpc.RegisterLanguageRuntimeServer(srv, h)
			return nil
		},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "pulumi-language-python: could not serve: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("%d\n", handle.Port)
	if err := <-handle.Done; err != nil {
		fmt.Fprintf(os.Stderr, "pulumi-language-python: %v\n", err)
		os.Exit(1)
	}
}

func pythonCmd(info *pulumirpc.ProgramInfo) string {
	return pythonCmdEnv(info, os.Environ())
}

// pythonCmdEnv is pythonCmd with the environment variables looked up in env (last one wins,
// as for exec.Cmd.Env).
func pythonCmdEnv(info *pulumirpc.ProgramInfo, env []string) string {
	if p := lookupEnv(env, "PULUMI_PYTHON_CMD"); p != "" {
		return p
	}
	if info != nil && info.GetOptions() != nil {
		if v, ok := info.GetOptions().GetFields()["virtualenv"]; ok && v.GetStringValue() != "" {
			venv := v.GetStringValue()
			if !filepath.IsAbs(venv) {
				venv = filepath.Join(info.GetRootDirectory(), venv)
			}
			return filepath.Join(venv, "bin", "python")
		}
	}
	if venv := lookupEnv(env, "VIRTUAL_ENV"); venv != "" {
		return filepath.Join(venv, "bin", "python")
	}
	return "python3"
}

func lookupEnv(env []string, key string) string {
	value := ""
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			value = v
		}
	}
	return value
}

// activateVenv returns env plus what `activate` would set when py lives in a virtualenv
// (<venv>/bin/python next to <venv>/pyvenv.cfg), so that the plugin's own subprocesses find
// the virtualenv's tools; env unchanged otherwise.
func activateVenv(env []string, py string) []string {
	if !strings.ContainsRune(py, filepath.Separator) {
		return env
	}
	venv := filepath.Dir(filepath.Dir(py))
	if _, err := os.Stat(filepath.Join(venv, "pyvenv.cfg")); err != nil {
		return env
	}
	if abs, err := filepath.Abs(venv); err == nil {
		venv = abs
	}
	path := filepath.Join(venv, "bin")
	if old := lookupEnv(env, "PATH"); old != "" {
		path += string(os.PathListSeparator) + old
	}
	return append(env, "VIRTUAL_ENV="+venv, "PATH="+path)
}

func executor() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	if resolved, err := filepath.EvalSymlinks(self); err == nil {
		self = resolved
	}
	p := filepath.Join(filepath.Dir(self), "pulumi-language-python-exec")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("missing executor %s: %w", p, err)
	}
	return p, nil
}

func (h *host) GetRequiredPlugins(
	context.Context, *pulumirpc.GetRequiredPluginsRequest,
) (*pulumirpc.GetRequiredPluginsResponse, error) {
	return &pulumirpc.GetRequiredPluginsResponse{}, nil
}

func (h *host) GetRequiredPackages(
	context.Context, *pulumirpc.GetRequiredPackagesRequest,
) (*pulumirpc.GetRequiredPackagesResponse, error) {
	return &pulumirpc.GetRequiredPackagesResponse{}, nil
}

func (h *host) GetProgramDependencies(
	context.Context, *pulumirpc.GetProgramDependenciesRequest,
) (*pulumirpc.GetProgramDependenciesResponse, error) {
	return &pulumirpc.GetProgramDependenciesResponse{}, nil
}

func (h *host) GetPluginInfo(context.Context, *pbempty.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: version}, nil
}

func (h *host) About(_ context.Context, req *pulumirpc.AboutRequest) (*pulumirpc.AboutResponse, error) {
	py := pythonCmd(req.GetInfo())
	out, err := exec.Command(py, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("running %s --version: %w", py, err)
	}
	return &pulumirpc.AboutResponse{
		Executable: py,
		Version:    strings.TrimPrefix(strings.TrimSpace(string(out)), "Python "),
	}, nil
}

func (h *host) Cancel(context.Context, *pbempty.Empty) (*pbempty.Empty, error) {
	return &pbempty.Empty{}, nil
}

func (h *host) Run(ctx context.Context, req *pulumirpc.RunRequest) (*pulumirpc.RunResponse, error) {
	execScript, err := executor()
	if err != nil {
		return nil, err
	}
	program := req.GetProgram() //nolint:staticcheck // still sent by the engine
	root := ""
	if info := req.GetInfo(); info != nil {
		root = info.GetRootDirectory()
		if ep := info.GetEntryPoint(); ep != "" {
			program = ep
		}
	}
	if program == "" {
		program = "."
	}
	parallel := req.GetParallel()
	if parallel <= 0 {
		parallel = 1
	}
	args := []string{
		"-u", execScript,
		"--monitor", req.GetMonitorAddress(),
		"--engine", h.engine,
		"--project", req.GetProject(),
		"--stack", req.GetStack(),
		"--pwd", req.GetPwd(),
		"--dry_run", strconv.FormatBool(req.GetDryRun()),
		"--parallel", strconv.Itoa(int(parallel)),
	}
	if root != "" {
		args = append(args, "--root_directory", root)
	}
	if org := req.GetOrganization(); org != "" {
		args = append(args, "--organization", org)
	}
	args = append(args, program)
	args = append(args, req.GetArgs()...)

	cfg := req.GetConfig()
	if cfg == nil {
		cfg = map[string]string{} // the SDK expects an object, never null
	}
	config, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	secretKeys := req.GetConfigSecretKeys()
	if secretKeys == nil {
		secretKeys = []string{}
	}
	secrets, err := json.Marshal(secretKeys)
	if err != nil {
		return nil, err
	}

	cmd := exec.CommandContext(ctx, pythonCmd(req.GetInfo()), args...)
	cmd.Dir = req.GetPwd()
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stderr
	cmd.Env = append(os.Environ(),
		"PULUMI_CONFIG="+string(config),
		"PULUMI_CONFIG_SECRET_KEYS="+string(secrets),
		"PULUMI_PROJECT="+req.GetProject(),
		"PULUMI_STACK="+req.GetStack(),
		"PULUMI_ORGANIZATION="+req.GetOrganization(),
		"PULUMI_DRY_RUN="+strconv.FormatBool(req.GetDryRun()),
		"PULUMI_PARALLEL="+strconv.Itoa(int(parallel)),
		"PULUMI_MONITOR="+req.GetMonitorAddress(),
		"PULUMI_ENGINE="+h.engine,
	)
	if err := cmd.Run(); err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			if exitErr.ExitCode() == bailExitCode {
				return &pulumirpc.RunResponse{Bail: true}, nil
			}
			return &pulumirpc.RunResponse{
				Error: fmt.Sprintf("Program exited with non-zero exit code: %d", exitErr.ExitCode()),
			}, nil
		}
		return &pulumirpc.RunResponse{Error: fmt.Sprintf("running %s: %v", cmd.Path, err)}, nil
	}
	return &pulumirpc.RunResponse{}, nil
}

// streamWriter sends what a plugin writes to one of its streams as RunPluginResponse messages.
// A gRPC stream must not be sent on from two goroutines at once, and exec copies stdout and
// stderr in separate goroutines, hence the shared lock.
type streamWriter struct {
	mu   *sync.Mutex
	send func([]byte) error
}

func (w streamWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	// The message may be marshalled after Send returns: send a copy, exec reuses its buffer.
	if err := w.send(append([]byte(nil), p...)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// RunPlugin runs a Python plugin (for autoheal: the policy pack) from its folder's __main__.py,
// streaming its stdout and stderr, then its exit code when that is not 0 (a clean exit ends
// the stream, which the engine reads as exit code 0).
func (h *host) RunPlugin(
	req *pulumirpc.RunPluginRequest, server pulumirpc.LanguageRuntime_RunPluginServer,
) error {
	info := req.GetInfo()
	program := req.GetProgram() //nolint:staticcheck // still sent by older engines
	if info != nil {
		if dir := info.GetProgramDirectory(); dir != "" {
			program = dir
			if ep := info.GetEntryPoint(); ep != "" && ep != "." {
				program = filepath.Join(dir, ep)
			}
		}
	}
	if program == "" {
		return errors.New("RunPlugin: the request names no plugin program")
	}
	env := req.GetEnv()
	if len(env) == 0 {
		env = os.Environ()
	}
	py := pythonCmdEnv(info, env)
	if strings.ContainsRune(py, filepath.Separator) {
		if _, err := os.Stat(py); err != nil {
			return fmt.Errorf("RunPlugin: python interpreter for %s: %w "+
				"(set PULUMI_PYTHON_CMD, or the virtualenv runtime option)", program, err)
		}
	} else if _, err := exec.LookPath(py); err != nil {
		return fmt.Errorf("RunPlugin: python interpreter for %s: %w", program, err)
	}

	args := append([]string{"-u", program}, req.GetArgs()...)
	cmd := exec.CommandContext(server.Context(), py, args...)
	cmd.Dir = req.GetPwd()
	cmd.Env = append(activateVenv(env, py), "PYTHONUNBUFFERED=1")
	// Stopping the plugin (the engine cancels the stream) kills it; don't then wait forever
	// for pipes that a grandchild may hold open.
	cmd.WaitDelay = 5 * time.Second
	var mu sync.Mutex
	cmd.Stdout = streamWriter{mu: &mu, send: func(b []byte) error {
		return server.Send(&pulumirpc.RunPluginResponse{
			Output: &pulumirpc.RunPluginResponse_Stdout{Stdout: b},
		})
	}}
	cmd.Stderr = streamWriter{mu: &mu, send: func(b []byte) error {
		return server.Send(&pulumirpc.RunPluginResponse{
			Output: &pulumirpc.RunPluginResponse_Stderr{Stderr: b},
		})
	}}

	if err := cmd.Run(); err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			code := exitErr.ExitCode()
			if code < 0 { // killed by a signal
				code = 1
			}
			mu.Lock()
			defer mu.Unlock()
			return server.Send(&pulumirpc.RunPluginResponse{
				Output: &pulumirpc.RunPluginResponse_Exitcode{Exitcode: int32(code)}, //nolint:gosec // 0..255
			})
		}
		return fmt.Errorf("RunPlugin: could not run %s %s: %w", py, program, err)
	}
	return nil
}

// InstallDependencies installs nothing: programs and plugins (the policy pack) use the
// virtualenv that `pip install -e .` sets up, offline. It reports the interpreter it would use,
// and fails when that interpreter cannot run.
func (h *host) InstallDependencies(
	req *pulumirpc.InstallDependenciesRequest,
	server pulumirpc.LanguageRuntime_InstallDependenciesServer,
) error {
	py := pythonCmd(req.GetInfo())
	out, err := exec.CommandContext(server.Context(), py, "--version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("running %s --version: %w: %s", py, err, strings.TrimSpace(string(out)))
	}
	msg := fmt.Sprintf("Using %s (%s); this language host installs no dependencies "+
		"(pip install -e . sets up the virtualenv).\n", py, strings.TrimSpace(string(out)))
	return server.Send(&pulumirpc.InstallDependenciesResponse{Stdout: []byte(msg)})
}
