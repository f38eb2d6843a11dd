// A host-path provisioner for the real test node (scripts/test-cluster up --real-node
// --provisioner): sig-storage-lib-external-provisioner's controller (the one the CSI
// external-provisioner is built on) with a Provisioner that makes one folder per volume
// under --dir and a hostPath PersistentVolume pinned to the node the claim's consumer was
// placed on (the claim's volume.kubernetes.io/selected-node, which a scheduler writes for a
// WaitForFirstConsumer class). Delete removes the folder. It serves one node: a claim
// whose selected node is another is left to that node's provisioner.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v11/controller"
)

const annDir = "gpupool.io/hostpath-dir"

type hostPath struct {
	dir, node, name string
}

func (p *hostPath) Provision(_ context.Context, o controller.ProvisionOptions) (*v1.PersistentVolume, controller.ProvisioningState, error) {
	if o.SelectedNode == nil {
		return nil, controller.ProvisioningFinished,
			errors.New("no selected node: use a StorageClass with volumeBindingMode WaitForFirstConsumer")
	}
	if o.SelectedNode.Name != p.node {
		return nil, controller.ProvisioningFinished, &controller.IgnoredError{
			Reason: fmt.Sprintf("node %s is not this provisioner's (%s)", o.SelectedNode.Name, p.node)}
	}
	dir := filepath.Join(p.dir, o.PVName)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	// any user of the pod may write: the umask does not narrow it
	if err := os.Chmod(dir, 0o777); err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	reclaim := v1.PersistentVolumeReclaimDelete
	if o.StorageClass.ReclaimPolicy != nil {
		reclaim = *o.StorageClass.ReclaimPolicy
	}
	dirType := v1.HostPathDirectory
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: o.PVName, Annotations: map[string]string{annDir: dir}},
		Spec: v1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: reclaim,
			AccessModes:                   o.PVC.Spec.AccessModes,
			Capacity:                      v1.ResourceList{v1.ResourceStorage: o.PVC.Spec.Resources.Requests[v1.ResourceStorage]},
			StorageClassName:              o.StorageClass.Name,
			VolumeMode:                    o.PVC.Spec.VolumeMode,
			MountOptions:                  o.StorageClass.MountOptions,
			PersistentVolumeSource: v1.PersistentVolumeSource{
				HostPath: &v1.HostPathVolumeSource{Path: dir, Type: &dirType},
			},
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{
				NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{{
					Key: "kubernetes.io/hostname", Operator: v1.NodeSelectorOpIn,
					Values: []string{p.node},
				}}}},
			}},
		},
	}, controller.ProvisioningFinished, nil
}

func (p *hostPath) Delete(_ context.Context, pv *v1.PersistentVolume) error {
	dir := pv.Annotations[annDir]
	if dir == "" || filepath.Dir(dir) != filepath.Clean(p.dir) {
		return &controller.IgnoredError{Reason: "not a volume of this provisioner's folder"}
	}
	return os.RemoveAll(dir)
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server")
	dir := flag.String("dir", "", "folder that holds the volumes' folders")
	node := flag.String("node", "", "the node whose volumes this provisioner makes")
	name := flag.String("name", "gpupool.local/hostpath", "provisioner name (a StorageClass's provisioner)")
	klog.InitFlags(nil)
	flag.Parse()
	if *kubeconfig == "" || *dir == "" || *node == "" {
		klog.Fatal("--kubeconfig, --dir and --node are required")
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		klog.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	p := &hostPath{dir: *dir, node: *node, name: *name}
	controller.NewProvisionController(ctx, client, *name, p,
		controller.LeaderElection(false),
		controller.FailedProvisionThreshold(0),
		controller.FailedDeleteThreshold(0),
	).Run(ctx)
}
