// fake-gpu: the GPU of the real test node (scripts/test-cluster up --real-node --fake-gpus N)
// is the only thing mocked; everything around it is real.
//
//	fake-gpu plugin --gpus N [--uuid-prefix GPU-fake-] [--dir /var/lib/kubelet/device-plugins]
//	fake-gpu report [--annotation gpupool.io/reserved-gpu]
//
// plugin: a device plugin for the kubelet's device manager, as the NVIDIA device plugin is
// with its default strategies (DEVICE_ID_STRATEGY=uuid, DEVICE_LIST_STRATEGY=envvar). It
// registers nvidia.com/gpu with the kubelet (DIR/kubelet.sock), advertises N healthy devices
// whose IDs are UUIDs (PREFIX0 .. PREFIX<N-1>), and answers Allocate with
// NVIDIA_VISIBLE_DEVICES=<the devices' UUIDs, comma-separated>, the variable through which
// the NVIDIA container toolkit would expose those GPUs. Its preferred allocation is the
// lowest-numbered free devices, so which GPU a container gets is deterministic. It serves
// again and registers again when the kubelet restarts (a new kubelet.sock).
//
// report: the container of gpupool-scheduler's GPU reservation pod (decision 0060): it
// reads the GPU it was given (the first UUID of NVIDIA_VISIBLE_DEVICES), writes it on its
// own pod (annotation, merge patch through the in-cluster API server with the pod's service
// account token; POD_NAMESPACE and POD_NAME from the downward API), then holds the GPU until
// SIGTERM. It exits 1 when it was given no single GPU.
//
// Built static (CGO_ENABLED=0) from k8s.io/kubelet's device plugin API and gRPC.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	resourceName = "nvidia.com/gpu"
	socketName   = "gpupool-fake-gpu.sock"
	saDir        = "/var/run/secrets/kubernetes.io/serviceaccount"
)

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetPrefix("fake-gpu: ")
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: fake-gpu plugin|report [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "plugin":
		err = plugin(os.Args[2:])
	case "report":
		err = report(os.Args[2:])
	default:
		err = fmt.Errorf("unknown subcommand %q (plugin, report)", os.Args[1])
	}
	if err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

// ------------------------------------------------------------------------------ plugin

type devicePlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	uuids []string       // by index
	index map[string]int // uuid -> index
}

func (p *devicePlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

func (p *devicePlugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	devs := make([]*pluginapi.Device, len(p.uuids))
	for i, u := range p.uuids {
		devs[i] = &pluginapi.Device{ID: u, Health: pluginapi.Healthy}
	}
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
		return err
	}
	<-s.Context().Done() // the devices never change
	return nil
}

// GetPreferredAllocation: the devices that must be included, then the lowest-numbered
// available ones.
func (p *devicePlugin) GetPreferredAllocation(_ context.Context, r *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	out := &pluginapi.PreferredAllocationResponse{}
	for _, c := range r.ContainerRequests {
		chosen := append([]string{}, c.MustIncludeDeviceIDs...)
		taken := map[string]bool{}
		for _, id := range chosen {
			taken[id] = true
		}
		avail := append([]string{}, c.AvailableDeviceIDs...)
		sort.Slice(avail, func(i, j int) bool { return p.index[avail[i]] < p.index[avail[j]] })
		for _, id := range avail {
			if len(chosen) >= int(c.AllocationSize) {
				break
			}
			if !taken[id] {
				chosen = append(chosen, id)
				taken[id] = true
			}
		}
		out.ContainerResponses = append(out.ContainerResponses,
			&pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: chosen})
	}
	return out, nil
}

func (p *devicePlugin) Allocate(_ context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	out := &pluginapi.AllocateResponse{}
	for _, c := range r.ContainerRequests {
		for _, id := range c.DevicesIds {
			if _, ok := p.index[id]; !ok {
				return nil, fmt.Errorf("unknown device %q", id)
			}
		}
		log.Printf("allocate %s", strings.Join(c.DevicesIds, ","))
		out.ContainerResponses = append(out.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(c.DevicesIds, ",")},
		})
	}
	return out, nil
}

func (p *devicePlugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func plugin(args []string) error {
	fs := flag.NewFlagSet("plugin", flag.ExitOnError)
	n := fs.Int("gpus", 1, "how many fake GPUs to advertise")
	prefix := fs.String("uuid-prefix", "GPU-fake-", "the devices' UUIDs are PREFIX0, PREFIX1, ...")
	dir := fs.String("dir", pluginapi.DevicePluginPath, "the kubelet's device plugin folder (kubelet.sock)")
	_ = fs.Parse(args)
	if *n < 1 {
		return fmt.Errorf("--gpus must be 1 or more, not %d", *n)
	}
	p := &devicePlugin{index: map[string]int{}}
	for i := 0; i < *n; i++ {
		u := *prefix + strconv.Itoa(i)
		p.uuids = append(p.uuids, u)
		p.index[u] = i
	}
	kubeletSock := filepath.Join(*dir, "kubelet.sock")
	own := filepath.Join(*dir, socketName)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	for ctx.Err() == nil {
		kubelet, err := waitForFile(ctx, kubeletSock)
		if err != nil {
			return nil // stopped
		}
		srv, err := serve(p, own)
		if err != nil {
			return err
		}
		if err := register(ctx, kubeletSock); err != nil {
			srv.Stop()
			log.Printf("registering with the kubelet: %v (trying again)", err)
			sleep(ctx, time.Second)
			continue
		}
		log.Printf("registered %s with the kubelet: %d devices %s", resourceName, len(p.uuids), strings.Join(p.uuids, ","))
		// Until the kubelet restarts (a new kubelet.sock) or removes our socket.
		for ctx.Err() == nil {
			sleep(ctx, time.Second)
			now, err1 := os.Stat(kubeletSock)
			_, err2 := os.Stat(own)
			if err1 != nil || err2 != nil || !os.SameFile(now, kubelet) {
				log.Print("the kubelet restarted or removed our socket: serving and registering again")
				break
			}
		}
		srv.Stop()
	}
	_ = os.Remove(own)
	return nil
}

func serve(p *devicePlugin, sock string) (*grpc.Server, error) {
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", sock, err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(l) }()
	return srv, nil
}

func register(ctx context.Context, kubeletSock string) error {
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     socketName,
		ResourceName: resourceName,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	return err
}

func waitForFile(ctx context.Context, path string) (os.FileInfo, error) {
	for {
		if fi, err := os.Stat(path); err == nil {
			return fi, nil
		}
		if !sleep(ctx, 200*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// ------------------------------------------------------------------------------ report

func report(args []string) error {
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	annotation := fs.String("annotation", "gpupool.io/reserved-gpu", "the annotation to write the GPU's UUID in")
	_ = fs.Parse(args)
	given := os.Getenv("NVIDIA_VISIBLE_DEVICES")
	uuid := strings.TrimSpace(strings.Split(given, ",")[0])
	if uuid == "" || uuid == "all" || uuid == "none" || uuid == "void" {
		return fmt.Errorf("no single GPU given (NVIDIA_VISIBLE_DEVICES=%q)", given)
	}
	ns, name := os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME")
	if ns == "" || name == "" {
		return errors.New("POD_NAMESPACE and POD_NAME must be set (downward API)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{*annotation: uuid}}})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := patchPod(ctx, ns, name, patch)
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("writing %s on pod %s/%s: %w", *annotation, ns, name, err)
		}
		log.Printf("writing %s on pod %s/%s: %v (trying again)", *annotation, ns, name, err)
		sleep(ctx, time.Second)
	}
	fmt.Printf("NVIDIA_VISIBLE_DEVICES=%s reserved %s\n", given, uuid)
	<-ctx.Done()
	return nil
}

func patchPod(ctx context.Context, ns, name string, patch []byte) error {
	token, err := os.ReadFile(filepath.Join(saDir, "token"))
	if err != nil {
		return err
	}
	ca, err := os.ReadFile(filepath.Join(saDir, "ca.crt"))
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return errors.New("no certificate in " + filepath.Join(saDir, "ca.crt"))
	}
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return errors.New("KUBERNETES_SERVICE_HOST/PORT are not set (not in a pod?)")
	}
	url := fmt.Sprintf("https://%s/api/v1/namespaces/%s/pods/%s", net.JoinHostPort(host, port), ns, name)
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, url, bytes.NewReader(patch))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Content-Type", "application/merge-patch+json")
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}
