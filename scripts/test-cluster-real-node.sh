# A real node for scripts/test-cluster (`up --real-node`): containerd and a kubelet, with
# etcd and kube-apiserver, in a network and mount namespace of the run's own. Sourced by
# scripts/test-cluster; uses its state_dir, pids, start, wait_for, log and die.
#
# Why each piece is as it is (docs/decisions/0064-a-real-node-in-the-test-cluster.md):
# - One holder process (`unshare --net --mount --propagation private`) owns both namespaces;
#   every daemon enters them with `nsenter -t HOLDER -m -n`. `ip netns exec` would remount
#   /sys (hiding the cgroups) and give each call its own mount namespace.
# - Inside, tmpfs covers /run, /var/lib and /var/log, the paths containerd, the CNI plugins
#   and kubelet write outside their configured dirs (/run/containerd/s, /run/netns,
#   /var/lib/cni, /var/lib/kubelet/device-plugins, /var/log/pods): they vanish with the
#   namespace and never meet another run's.
# - The kubelet's root is in the state dir (--root-dir); its pods dir is bind-mounted at the
#   usual /var/lib/kubelet/pods on that tmpfs, where the node agent's DaemonSet reads it.
# - Files holding kubelet's wanted values are bind-mounted over the three /proc/sys entries
#   it would otherwise set on the host.
# - A veth pair carries the node IP (there is no `dummy` device; kubelet refuses loopback).
#   The namespace has no link to the host and no default route: the host reaches the API
#   server through a unix socket in the state dir (socat on both sides), and pods through
#   port-forward. Without kube-proxy, one DNAT rule of the namespace's own sends pods'
#   https://10.0.0.1 (the `kubernetes` Service) to the API server, which listens on every
#   address inside.
# - The run's pods live under the cgroup /gpupool-RUN in every hierarchy (cgroupRoot).
# - With --fake-gpus N, scripts/fake-gpu serves as the node's device plugin: it registers at
#   /var/lib/kubelet/device-plugins/kubelet.sock, where the kubelet's device manager listens
#   whatever its --root-dir; that folder is on the namespace's own /var/lib, so two runs'
#   plugins and kubelets never meet. Its UUIDs carry the run's id.
# - With --cluster-dns (docs/decisions/0065): kube-proxy (iptables mode) and CoreDNS run as
#   daemons in the same namespaces, so their rules and sockets exist only there. CoreDNS
#   listens on the node IP behind the kube-dns Service (10.0.0.10, an EndpointSlice naming
#   the node IP), which is the kubelet's clusterDNS. kube-proxy masquerades all Service
#   traffic: a pod reaching a pod on the same bridge through a Service address then gets the
#   answer back through the namespace's conntrack (hairpin included). It leaves every
#   conntrack sysctl as it is (nf_conntrack_max is the host's) and binds node ports to the
#   node IP only, so it sets no route_localnet.
# - With --provisioner (docs/decisions/0066): scripts/hostpath-provisioner runs as a daemon in
#   the same namespaces and makes each claimed volume a folder of DIR/node/volumes, a hostPath
#   PersistentVolume pinned to the node; the StorageClass gpupool-hostpath binds on the first
#   consumer. The folders go with DIR/node on teardown.

REAL_NODE_NAME="${REAL_NODE_NAME:-real-node}"
REAL_NODE_IP=10.200.0.1     # on the veth inside the namespace; nothing outside sees it
REAL_POD_SUBNET=10.88.0.0/16
REAL_SERVICE_IP=10.0.0.1    # the `kubernetes` Service (first of --service-cluster-ip-range)
REAL_DNS_IP=10.0.0.10       # --cluster-dns: the kube-dns Service, the kubelet's clusterDNS
# On the namespace's own /run: short (a unix socket path has 108 bytes), and private.
REAL_CONTAINERD_SOCK=/run/containerd/containerd.sock

real_node=0
cluster_dns=0
provisioner=0
REAL_STORAGE_CLASS=gpupool-hostpath  # --provisioner: its StorageClass
REAL_PROVISIONER_NAME=gpupool.local/hostpath
holder_pid=""
holder_mntns=""
run_id=""
cg_name=""
image_archives=()
fake_gpus=0
# The kubelet's device manager's folder (fixed in the kubelet, not under --root-dir).
REAL_DEVICE_PLUGIN_DIR=/var/lib/kubelet/device-plugins

real_node_check() {
    (($(id -u) == 0)) || die "--real-node needs root (namespaces, cgroups, mounts)"
    local c missing=()
    for c in containerd containerd-shim-runc-v2 runc ctr socat unshare nsenter ip iptables; do
        command -v "$c" >/dev/null || missing+=("$c")
    done
    [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] \
        || missing+=(containernetworking-plugins)
    ((${#missing[@]} == 0)) || die "--real-node needs ${missing[*]} (scripts/setup-system installs them)"
    [[ -x "$k8s_bin/kubelet" ]] || die "no kubelet in $k8s_bin (scripts/test-cluster build)"
    ((!cluster_dns)) || cluster_dns_cached \
        || die "no kube-proxy or CoreDNS (scripts/test-cluster build --cluster-dns)"
    ((!provisioner)) || provisioner_cached \
        || die "no host-path provisioner (scripts/test-cluster build --provisioner)"
    [[ -f "$pause_archive" ]] || die "no pause image at $pause_archive (scripts/test-cluster build)"
}

# The mounted cgroup hierarchies: v1 (kubelet's cgroupfs driver uses each) and the v2 mount
# beside them (runc makes its cgroups there too).
cgroup_dirs() { awk '$3 == "cgroup" || $3 == "cgroup2" {print $2}' /proc/mounts; }

real_node_pki() {  # the kubelet's serving cert and the API server's client cert for kubelets
    (
        cd "$state_dir/pki"
        openssl ecparam -name prime256v1 -genkey -noout -out kubelet.key 2>/dev/null
        openssl req -new -key kubelet.key -subj "/CN=system:node:$REAL_NODE_NAME/O=system:nodes" \
            -out kubelet.csr 2>/dev/null
        printf '%s\n' "subjectAltName=IP:$REAL_NODE_IP,DNS:$REAL_NODE_NAME" \
            "extendedKeyUsage=serverAuth" >kubelet.ext
        openssl x509 -req -in kubelet.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
            -sha256 -extfile kubelet.ext -out kubelet.crt 2>/dev/null
        openssl ecparam -name prime256v1 -genkey -noout -out apiserver-kubelet.key 2>/dev/null
        openssl req -new -key apiserver-kubelet.key -out apiserver-kubelet.csr \
            -subj "/CN=kube-apiserver-kubelet-client/O=system:masters" 2>/dev/null
        printf '%s\n' "extendedKeyUsage=clientAuth" >client.ext
        openssl x509 -req -in apiserver-kubelet.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
            -days 3650 -sha256 -extfile client.ext -out apiserver-kubelet.crt 2>/dev/null
        chmod 600 ./*.key
    )
}

# The namespaces, the holder, and the API server's socket bridge. Sets ns_exec.
real_node_namespace() {
    run_id="$(printf '%s' "$state_dir" | sha256sum | cut -c1-10)"
    cg_name="gpupool-$run_id"
    local s="$state_dir/node"
    mkdir -p "$s/sysctl" "$s/cni/net.d" "$s/containerd" "$s/kubelet"
    # kubelet's values: it writes a /proc/sys entry only when it differs.
    echo 1 >"$s/sysctl/vm.overcommit_memory"
    echo 10 >"$s/sysctl/kernel.panic"
    echo 1 >"$s/sysctl/kernel.panic_on_oops"
    echo "nameserver 127.0.0.1" >"$s/resolv.conf"
    cat >"$s/holder.sh" <<HOLDER
set -e
mount -t tmpfs -o mode=755 gpupool-run /run
mount -t tmpfs -o mode=755 gpupool-varlib /var/lib
mount -t tmpfs -o mode=755 gpupool-varlog /var/log
# the kubelet's pods at their usual path too, for pods that mount it (the node agent's
# kubeletPodsDir, with HostToContainer propagation: a shared mount, peers only in here)
mkdir -p "$s/kubelet/pods" /var/lib/kubelet/pods
mount --bind "$s/kubelet/pods" /var/lib/kubelet/pods
mount --make-shared /var/lib/kubelet/pods
mount --bind "$s/sysctl/vm.overcommit_memory" /proc/sys/vm/overcommit_memory
mount --bind "$s/sysctl/kernel.panic" /proc/sys/kernel/panic
mount --bind "$s/sysctl/kernel.panic_on_oops" /proc/sys/kernel/panic_on_oops
ip link set lo up
ip link add gp0 type veth peer name gp1
ip addr add $REAL_NODE_IP/24 dev gp0
ip link set gp0 up
ip link set gp1 up
iptables -t nat -A PREROUTING -d $REAL_SERVICE_IP/32 -p tcp --dport 443 \
    -j DNAT --to-destination $REAL_NODE_IP:$api_port
touch "$s/holder-ready"
exec sleep infinity
HOLDER
    start holder unshare --net --mount --propagation private sh "$s/holder.sh"
    holder_pid="${pids[-1]}"
    wait_for "the node's namespaces" 20 test -e "$s/holder-ready"
    holder_mntns="$(readlink "/proc/$holder_pid/ns/mnt")"
    echo "$holder_pid" >"$s/holder.pid"
    ns_exec=(nsenter -t "$holder_pid" -m -n)
}

real_node_api_bridge() {  # host 127.0.0.1:PORT -> DIR/node/api.sock -> 127.0.0.1:PORT inside
    local sock="$state_dir/node/api.sock"
    ((${#sock} < 100)) || die "state dir too long for a unix socket path: $sock"
    rm -f "$sock"
    start api-bridge-in "${ns_exec[@]}" socat "UNIX-LISTEN:$sock,fork,mode=600" \
        "TCP:127.0.0.1:$api_port"
    wait_for "the API server's socket" 20 test -S "$sock"
    start api-bridge-host socat "TCP-LISTEN:$api_port,bind=127.0.0.1,fork,reuseaddr" \
        "UNIX-CONNECT:$sock"
}

real_node_apiserver_flags() {
    local pki="$state_dir/pki"
    printf '%s\n' --kubelet-client-certificate="$pki/apiserver-kubelet.crt" \
        --kubelet-client-key="$pki/apiserver-kubelet.key" \
        --kubelet-certificate-authority="$pki/ca.crt" \
        --kubelet-preferred-address-types=InternalIP
}

real_node_cgroups() {
    local d
    for d in $(cgroup_dirs); do
        mkdir -p "$d/$cg_name"
        if [[ -f "$d/cpuset.cpus" ]]; then  # a new cpuset cgroup starts with no CPUs
            cat "$d/cpuset.cpus" >"$d/$cg_name/cpuset.cpus"
            cat "$d/cpuset.mems" >"$d/$cg_name/cpuset.mems"
        fi
    done
}

real_node_containerd() {
    local s="$state_dir/node" c="$state_dir/node/containerd"
    cat >"$s/cni/net.d/10-gpupool.conflist" <<CNI
{"cniVersion": "0.4.0", "name": "$cg_name",
 "plugins": [{"type": "bridge", "bridge": "gp-br0", "isGateway": true, "ipMasq": false,
   "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$REAL_POD_SUBNET"}]],
     "routes": [{"dst": "0.0.0.0/0"}]}}]}
CNI
    cat >"$c/config.toml" <<TOML
version = 2
root = "$c/root"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$REAL_CONTAINERD_SOCK"
[plugins."io.containerd.internal.v1.opt"]
  path = "$c/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_tag"
  # No CAP_SYS_RESOURCE here: containers may not get a lower oom_score_adj than containerd.
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$s/cni/net.d"
TOML
    start containerd "${ns_exec[@]}" containerd --config "$c/config.toml"
    wait_for containerd 60 "${ns_exec[@]}" ctr --address "$REAL_CONTAINERD_SOCK" version
}

real_node_import() {  # archive...: load docker-archive/OCI tars into the CRI's namespace
    local a
    for a in "$@"; do
        [[ -f "$a" ]] || die "no image archive $a"
        log "importing $(basename "$a")"
        "${ns_exec[@]}" ctr --address "$REAL_CONTAINERD_SOCK" -n k8s.io \
            images import --no-unpack=false "$a" >/dev/null || die "could not import $a"
    done
}

real_node_kubelet() {
    local s="$state_dir/node" pki="$state_dir/pki"
    cat >"$s/kubelet.yaml" <<KUBELET
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$REAL_CONTAINERD_SOCK
# cgroup v1 only here (kubelet refuses it unless told), without systemd.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$cg_name
# No CAP_SYS_RESOURCE: kubelet may not lower its own oom_score_adj.
oomScoreAdj: 0
failSwapOn: false
resolvConf: $s/resolv.conf
address: $REAL_NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
tlsCertFile: $pki/kubelet.crt
tlsPrivateKeyFile: $pki/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: AlwaysAllow}
volumePluginDir: $s/kubelet/volume-plugins
# A shared test machine's disk and memory are not this node's to guard.
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
KUBELET
    if ((cluster_dns)); then
        printf '%s\n' "clusterDNS: [$REAL_DNS_IP]" "clusterDomain: cluster.local" >>"$s/kubelet.yaml"
    fi
    start kubelet "${ns_exec[@]}" "$k8s_bin/kubelet" --config="$s/kubelet.yaml" \
        --kubeconfig="$state_dir/kubeconfig" --root-dir="$s/kubelet" \
        --cert-dir="$s/kubelet/pki" --hostname-override="$REAL_NODE_NAME" \
        --node-ip="$REAL_NODE_IP" --node-labels="gpupool.io/real-node=true" -v=1
}

real_node_ready() {
    api GET "/api/v1/nodes/$REAL_NODE_NAME" | python3 -c '
import json, sys
conds = (json.load(sys.stdin).get("status") or {}).get("conditions") or []
sys.exit(not any(c["type"] == "Ready" and c["status"] == "True" for c in conds))'
}

real_node_gpus() {  # the node advertises $fake_gpus nvidia.com/gpu
    api GET "/api/v1/nodes/$REAL_NODE_NAME" | python3 -c '
import json, sys
alloc = (json.load(sys.stdin).get("status") or {}).get("allocatable") or {}
sys.exit(alloc.get("nvidia.com/gpu") != sys.argv[1])' "$fake_gpus"
}

real_node_fake_gpus() {  # after the kubelet started
    local prefix="GPU-fake-$run_id-"
    real_node_import "$fakegpu_dir/fake-gpu.tar"
    start fake-gpu-plugin "${ns_exec[@]}" "$fakegpu_dir/fake-gpu" plugin --gpus "$fake_gpus" \
        --uuid-prefix "$prefix" --dir "$REAL_DEVICE_PLUGIN_DIR"
    wait_for "$fake_gpus fake GPUs on node $REAL_NODE_NAME" 120 real_node_gpus
    cat >>"$state_dir/env" <<ENV
FAKE_GPUS=$fake_gpus
FAKE_GPU_UUID_PREFIX=$prefix
FAKE_GPU_IMAGE=$fakegpu_tag
ENV
}

# --cluster-dns: the kube-dns Service (no selector) and its EndpointSlice, the node IP.
real_node_dns_service() {
    wait_for "the kube-system namespace" 60 api GET /api/v1/namespaces/kube-system
    api POST /api/v1/namespaces/kube-system/services '{"apiVersion": "v1", "kind": "Service",
 "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
 "spec": {"clusterIP": "'"$REAL_DNS_IP"'", "ports": [
   {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
   {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53}]}}' >/dev/null
    api POST /apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices '{
 "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
 "metadata": {"name": "kube-dns-node", "namespace": "kube-system",
   "labels": {"kubernetes.io/service-name": "kube-dns",
     "endpointslice.kubernetes.io/managed-by": "test-cluster.gpupool.io"}},
 "addressType": "IPv4",
 "endpoints": [{"addresses": ["'"$REAL_NODE_IP"'"], "conditions": {"ready": true}}],
 "ports": [{"name": "dns", "port": 53, "protocol": "UDP"},
   {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]}' >/dev/null
}

real_node_coredns() {
    local s="$state_dir/node" ready_port
    ready_port="$(free_port)"
    cat >"$s/Corefile" <<COREFILE
cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {
    bind $REAL_NODE_IP
    errors
    ready 127.0.0.1:$ready_port
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $state_dir/kubeconfig gpupool-test
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
}
COREFILE
    start coredns "${ns_exec[@]}" "$coredns_bin/coredns" -conf "$s/Corefile"
    coredns_ready_url="http://127.0.0.1:$ready_port/ready"
}

real_node_kube_proxy() {
    local s="$state_dir/node"
    cat >"$s/kube-proxy.yaml" <<PROXY
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $state_dir/kubeconfig}
hostnameOverride: $REAL_NODE_NAME
bindAddress: $REAL_NODE_IP  # the node IP (kube-proxy finds no other)
mode: iptables
clusterCIDR: $REAL_POD_SUBNET
detectLocalMode: ClusterCIDR
iptables: {masqueradeAll: true, localhostNodePorts: false, minSyncPeriod: 0s, syncPeriod: 30s}
# nf_conntrack_max is the host's: leave every conntrack setting as it is
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
nodePortAddresses: [$REAL_NODE_IP/32]
# No CAP_SYS_RESOURCE: no lower oom_score_adj
oomScoreAdj: 0
healthzBindAddress: 127.0.0.1:$(free_port)
metricsBindAddress: 127.0.0.1:$(free_port)
PROXY
    start kube-proxy "${ns_exec[@]}" "$kube_proxy_bin/kube-proxy" --config="$s/kube-proxy.yaml" -v=1
}

# --provisioner: the host-path provisioner for this node, and its WaitForFirstConsumer class.
real_node_provisioner() {
    start hostpath-provisioner "${ns_exec[@]}" "$provisioner_bin/hostpath-provisioner" \
        --kubeconfig "$state_dir/kubeconfig" --node "$REAL_NODE_NAME" \
        --dir "$state_dir/node/volumes" --name "$REAL_PROVISIONER_NAME"
    api POST /apis/storage.k8s.io/v1/storageclasses '{"apiVersion": "storage.k8s.io/v1",
 "kind": "StorageClass", "metadata": {"name": "'"$REAL_STORAGE_CLASS"'"},
 "provisioner": "'"$REAL_PROVISIONER_NAME"'", "reclaimPolicy": "Delete",
 "volumeBindingMode": "WaitForFirstConsumer"}' >/dev/null
    echo "STORAGE_CLASS=$REAL_STORAGE_CLASS" >>"$state_dir/env"
}

# kube-proxy has written the kube-dns Service's rules, and CoreDNS has read the API server.
real_node_services_ready() {
    "${ns_exec[@]}" iptables -w -t nat -S KUBE-SERVICES 2>/dev/null | grep -q -- "-d $REAL_DNS_IP/32" \
        && "${ns_exec[@]}" curl -fsS "$coredns_ready_url" >/dev/null
}

real_node_up() {  # after the API server is ready
    real_node_cgroups
    real_node_containerd
    real_node_import "$pause_archive" "${image_archives[@]}"
    if ((cluster_dns)); then
        real_node_dns_service
        real_node_coredns
        real_node_kube_proxy
    fi
    real_node_kubelet
    wait_for "node $REAL_NODE_NAME to be Ready" 120 real_node_ready
    ((fake_gpus)) && real_node_fake_gpus
    ((provisioner)) && real_node_provisioner
    ((!cluster_dns)) || wait_for "kube-proxy's rules and CoreDNS" 120 real_node_services_ready
    cat >>"$state_dir/env" <<ENV
REAL_NODE=$REAL_NODE_NAME
REAL_NODE_HOLDER_PID=$holder_pid
REAL_NODE_CGROUP=/$cg_name
CONTAINERD_ADDRESS=$REAL_CONTAINERD_SOCK
ENV
    if ((cluster_dns)); then echo "CLUSTER_DNS=$REAL_DNS_IP" >>"$state_dir/env"; fi
}

# The processes of the run's pods: every pid in its cgroup tree (one hierarchy suffices).
cgroup_pids() {
    local d
    d="$(cgroup_dirs | grep -m1 '/pids$' || cgroup_dirs | head -n1)"
    [[ -d "$d/$cg_name" ]] || return 0
    find "$d/$cg_name" -name cgroup.procs -exec cat {} + 2>/dev/null || true
}

# Pids in the holder's mount namespace (containerd's shims outlive containerd).
mntns_pids() {
    local p
    [[ -n "$holder_mntns" ]] || return 0
    for p in /proc/[0-9]*; do
        [[ "$(readlink "$p/ns/mnt" 2>/dev/null)" == "$holder_mntns" ]] && echo "${p#/proc/}"
    done
}

kill_until_gone() {  # what command-listing-pids
    local what="$1" list
    shift
    for _ in $(seq 100); do
        list="$("$@")"
        [[ -z "$list" ]] && return 0
        # shellcheck disable=SC2086
        kill -KILL $list 2>/dev/null || true
        sleep 0.1
    done
    log "warning: $what still running: $list"
}

# First half of the teardown, before the daemons stop: kubelet goes first so that it
# restarts nothing, then the pods' processes.
real_node_stop_pods() {
    ((real_node)) || return 0
    local i
    for i in "${!names[@]}"; do
        [[ "${names[i]}" == kubelet ]] || continue
        kill -TERM "${pids[i]}" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "${pids[i]}" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "${pids[i]}" 2>/dev/null || true
    done
    [[ -n "$cg_name" ]] && kill_until_gone "the pods' processes" cgroup_pids
}

# Second half, after the daemons stopped: the shims, the namespaces, cgroups and state.
real_node_cleanup() {
    ((real_node)) || return 0
    kill_until_gone "processes in the node's mount namespace" mntns_pids
    local d
    if [[ -n "$cg_name" ]]; then
        for d in $(cgroup_dirs); do
            [[ -d "$d/$cg_name" ]] || continue
            for _ in $(seq 50); do  # a cgroup is busy until its last task is reaped
                find "$d/$cg_name" -depth -type d -exec rmdir {} + 2>/dev/null || true
                [[ -d "$d/$cg_name" ]] || break
                sleep 0.1
            done
            [[ -d "$d/$cg_name" ]] && log "warning: could not remove cgroup $d/$cg_name"
        done
    fi
    rm -rf "$state_dir/node"
}
