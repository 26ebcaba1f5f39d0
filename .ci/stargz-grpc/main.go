// containerd-stargz-grpc for the lazy-pull test engine (tests/remote_engine.py, lazy=True).
//
// Debian packages the stargz snapshotter's library but no daemon (its stargz-snapshotter
// package holds ctr-remote only), so .ci/stargz-install.sh builds this one against the
// suite's Go sources of the library. It is the smallest daemon the engine needs:
//
//   - a snapshotter over the library's FUSE filesystem (fs.NewFilesystem with its defaults:
//     eStargz tables of contents held in memory, prefetch and background fetch on);
//   - each layer found from the labels dockerd's pull puts on its snapshots (containerd's
//     snapshotters.AppendInfoHandlerWrapper: the image's reference, the layer's digest, the
//     image's layers), not the library's own default labels, which only ctr-remote sets;
//     a registry on localhost is spoken to in plain HTTP (as the library's default does):
//     that is how the engine's namespace reaches the local registry;
//   - served as containerd's snapshots API on a unix socket, for a proxy plugin;
//   - on SIGINT or SIGTERM, the server stops and the snapshotter's Close unmounts every layer
//     it mounted before the process exits, so nothing is left mounted under -root.
//
// No registry credentials, no CRI keychain (upstream's service package needs a CRI API that
// Debian 12 does not package), no metrics listener.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/contrib/snapshotservice"
	"github.com/containerd/containerd/pkg/snapshotters"
	"github.com/containerd/containerd/reference"
	"github.com/containerd/containerd/remotes/docker"
	stargzfs "github.com/containerd/stargz-snapshotter/fs"
	fsconfig "github.com/containerd/stargz-snapshotter/fs/config"
	"github.com/containerd/stargz-snapshotter/fs/source"
	"github.com/containerd/stargz-snapshotter/snapshot"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
)

func main() {
	address := flag.String("address", "/run/containerd-stargz-grpc/containerd-stargz-grpc.sock", "unix socket to serve the snapshots API on")
	root := flag.String("root", "/var/lib/containerd-stargz-grpc", "directory for the snapshots and the layers' caches")
	level := flag.String("log-level", "info", "logrus level: debug, info, warn, error")
	flag.Parse()
	if err := serve(*address, *root, *level); err != nil {
		fmt.Fprintf(os.Stderr, "containerd-stargz-grpc: %v\n", err)
		os.Exit(1)
	}
}

func serve(address, root, level string) error {
	parsed, err := logrus.ParseLevel(level)
	if err != nil {
		return err
	}
	logrus.SetLevel(parsed)
	ctx := context.Background()

	fsys, err := stargzfs.NewFilesystem(filepath.Join(root, "stargz"), fsconfig.Config{NoPrometheus: true},
		stargzfs.WithGetSources(fromPullLabels(registryHosts)))
	if err != nil {
		return fmt.Errorf("the filesystem under %s: %w", root, err)
	}
	sn, err := snapshot.NewSnapshotter(ctx, filepath.Join(root, "snapshotter"), fsys, snapshot.AsynchronousRemove)
	if err != nil {
		return fmt.Errorf("the snapshotter under %s: %w", root, err)
	}
	defer sn.Close() // unmounts every layer, committed ones included

	if err := os.MkdirAll(filepath.Dir(address), 0o700); err != nil {
		return err
	}
	if err := os.Remove(address); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("a stale socket at %s: %w", address, err)
	}
	listener, err := net.Listen("unix", address)
	if err != nil {
		return err
	}
	server := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(server, snapshotservice.FromSnapshotter(sn))

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	served := make(chan error, 1)
	go func() { served <- server.Serve(listener) }()
	logrus.Infof("serving the snapshots API on %s", address)
	select {
	case got := <-stop:
		logrus.Infof("%v: stopping", got)
		server.Stop()
		return nil
	case err := <-served:
		return err
	}
}

// registryHosts: the registry an image's reference names, in plain HTTP where it is on
// localhost, HTTPS elsewhere; no credentials. The client's Transport is set: the library's
// fetcher makes its requests with it directly.
func registryHosts(ref reference.Spec) ([]docker.RegistryHost, error) {
	client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	return docker.ConfigureDefaultRegistries(docker.WithPlainHTTP(docker.MatchLocalhost), docker.WithClient(client))(ref.Hostname())
}

// fromPullLabels finds a snapshot's layer from the labels of dockerd's pull: the image's
// reference, the layer's digest, and the image's layers from this one on (which the
// filesystem resolves ahead, to prefetch).
func fromPullLabels(hosts source.RegistryHosts) source.GetSources {
	return func(labels map[string]string) ([]source.Source, error) {
		ref, err := reference.Parse(labels[snapshotters.TargetRefLabel])
		if err != nil {
			return nil, fmt.Errorf("label %s: %w", snapshotters.TargetRefLabel, err)
		}
		layer, err := digest.Parse(labels[snapshotters.TargetLayerDigestLabel])
		if err != nil {
			return nil, fmt.Errorf("label %s: %w", snapshotters.TargetLayerDigestLabel, err)
		}
		var manifest ocispec.Manifest
		if listed := labels[snapshotters.TargetImageLayersLabel]; listed != "" {
			for _, each := range strings.Split(listed, ",") {
				d, err := digest.Parse(each)
				if err != nil {
					return nil, fmt.Errorf("label %s: %w", snapshotters.TargetImageLayersLabel, err)
				}
				manifest.Layers = append(manifest.Layers, ocispec.Descriptor{Digest: d})
			}
		}
		return []source.Source{{Hosts: hosts, Name: ref, Target: ocispec.Descriptor{Digest: layer}, Manifest: manifest}}, nil
	}
}
