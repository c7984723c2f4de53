package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/rollbox/rollbox/sandbox"
)

// deployDir holds the Kubernetes manifests (docs/scale-out.md).
const deployDir = "../../deploy/kubernetes"

// manifest is one YAML document of a file of deployDir.
type manifest struct {
	file string
	obj  map[string]any
}

func (m manifest) kind() string      { return yamlStr(m.obj, "kind") }
func (m manifest) name() string      { return yamlStr(m.obj, "metadata", "name") }
func (m manifest) namespace() string { return yamlStr(m.obj, "metadata", "namespace") }
func (m manifest) String() string    { return fmt.Sprintf("%s: %s %s", m.file, m.kind(), m.name()) }

// get walks obj by keys; nil when a key is missing.
func yamlGet(obj any, keys ...string) any {
	for _, k := range keys {
		m, ok := obj.(map[string]any)
		if !ok {
			return nil
		}
		obj = m[k]
	}
	return obj
}

func yamlStr(obj any, keys ...string) string {
	s, _ := yamlGet(obj, keys...).(string)
	return s
}

func yamlList(obj any, keys ...string) []any {
	l, _ := yamlGet(obj, keys...).([]any)
	return l
}

func yamlStrs(obj any, keys ...string) []string {
	var out []string
	for _, v := range yamlList(obj, keys...) {
		out = append(out, fmt.Sprint(v))
	}
	return out
}

// loadManifests parses every YAML file of deployDir, each document apart.
func loadManifests(t *testing.T) (files []string, docs []manifest) {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join(deployDir, "*.yaml"))
	if len(paths) == 0 {
		t.Fatalf("no manifests in %s", deployDir)
	}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(f)
		for i := 0; ; i++ {
			var obj map[string]any
			err := dec.Decode(&obj)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: document %d: %v", filepath.Base(p), i+1, err)
			}
			if obj == nil {
				continue
			}
			m := manifest{file: filepath.Base(p), obj: obj}
			if m.kind() == "Kustomization" {
				continue
			}
			if m.kind() == "" || yamlStr(obj, "apiVersion") == "" || m.name() == "" {
				t.Fatalf("%s: document %d has no kind, apiVersion or metadata.name", m.file, i+1)
			}
			docs = append(docs, m)
		}
		f.Close()
		files = append(files, filepath.Base(p))
	}
	return files, docs
}

// workloadKinds are the kinds whose spec.template is a pod template.
var workloadKinds = []string{"Deployment", "StatefulSet", "DaemonSet", "Job"}

// clusterScoped are the kinds that live in no namespace.
var clusterScoped = []string{"Namespace", "RuntimeClass", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "StorageClass"}

// configEnv is every variable readConfig reads: the environment rollbox
// takes its configuration from.
func configEnv() map[string]bool {
	seen := map[string]bool{}
	readConfig(func(k string) string { seen[k] = true; return "" })
	return seen
}

// TestKubernetesManifestsRunTheRealCLI parses every manifest of
// deploy/kubernetes and holds what it says against the code and against
// the other manifests, so that none can rot unnoticed: every rollbox
// command line a container runs names a real command with flags it defines
// and values those flags accept (parsed by the command tree itself);
// variables named ROLLBOX_* are ones rollbox reads; --cluster dials a NATS
// Service of the manifests on one of its ports; what a rollbox container
// listens on (--addr, --health-addr) is a port it declares; probes, Services
// and volumes point to what exists; and every container is hardened or
// says why it is privileged.
func TestKubernetesManifestsRunTheRealCLI(t *testing.T) {
	files, docs := loadManifests(t)
	byKind := map[string]map[string]manifest{}
	for _, m := range docs {
		if byKind[m.kind()] == nil {
			byKind[m.kind()] = map[string]manifest{}
		}
		byKind[m.kind()][m.namespace()+"/"+m.name()] = m
	}
	defined := func(kind, ns, name string) bool { _, ok := byKind[kind][ns+"/"+name]; return ok }

	t.Run("kustomization.yaml lists every manifest", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(deployDir, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var k struct {
			Resources []string `yaml:"resources"`
		}
		if err := yaml.Unmarshal(b, &k); err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if f != "kustomization.yaml" && !slices.Contains(k.Resources, f) {
				t.Errorf("kustomization.yaml does not list %s", f)
			}
		}
		for _, r := range k.Resources {
			if !slices.Contains(files, r) {
				t.Errorf("kustomization.yaml lists %s, which is not a manifest of %s", r, deployDir)
			}
		}
	})

	t.Run("namespaced objects are in a namespace the manifests make", func(t *testing.T) {
		for _, m := range docs {
			switch ns := m.namespace(); {
			case slices.Contains(clusterScoped, m.kind()):
				if ns != "" {
					t.Errorf("%s: a %s has no namespace", m, m.kind())
				}
			case ns == "":
				t.Errorf("%s: no metadata.namespace", m)
			case !defined("Namespace", "", ns):
				t.Errorf("%s: namespace %q is not among the manifests", m, ns)
			}
		}
	})

	secretsDoc, err := os.ReadFile("../../docs/scale-out.md")
	if err != nil {
		t.Fatal(err)
	}
	env := configEnv()
	ran := 0
	for _, w := range docs {
		if !slices.Contains(workloadKinds, w.kind()) {
			continue
		}
		pod := yamlGet(w.obj, "spec", "template", "spec")
		podLabels, _ := yamlGet(w.obj, "spec", "template", "metadata", "labels").(map[string]any)
		if sel, _ := yamlGet(w.obj, "spec", "selector", "matchLabels").(map[string]any); !labelsMatch(sel, podLabels) {
			t.Errorf("%s: spec.selector.matchLabels %v does not select the pod template's labels %v", w, sel, podLabels)
		}
		if rc := yamlStr(pod, "runtimeClassName"); rc != "" && !defined("RuntimeClass", "", rc) {
			t.Errorf("%s: runtimeClassName %q is not among the manifests", w, rc)
		}
		volumes := map[string]bool{}
		for _, v := range yamlList(pod, "volumes") {
			name := yamlStr(v, "name")
			volumes[name] = false
			if c := yamlStr(v, "persistentVolumeClaim", "claimName"); c != "" && !defined("PersistentVolumeClaim", w.namespace(), c) {
				t.Errorf("%s: volume %s claims %q, which is not among the manifests", w, name, c)
			}
			if c := yamlStr(v, "configMap", "name"); c != "" && !defined("ConfigMap", w.namespace(), c) {
				t.Errorf("%s: volume %s mounts ConfigMap %q, which is not among the manifests", w, name, c)
			}
			if s := yamlStr(v, "secret", "secretName"); s != "" && !defined("Secret", w.namespace(), s) &&
				!strings.Contains(string(secretsDoc), "kubectl -n "+w.namespace()+" create secret generic "+s+" ") {
				t.Errorf("%s: volume %s mounts Secret %q, which no manifest makes and docs/scale-out.md does not say how to make (kubectl -n %s create secret generic %s ...)", w, name, s, w.namespace(), s)
			}
		}
		for _, vct := range yamlList(yamlGet(w.obj, "spec"), "volumeClaimTemplates") {
			volumes[yamlStr(vct, "metadata", "name")] = false
		}
		annotations, _ := yamlGet(w.obj, "spec", "template", "metadata", "annotations").(map[string]any)
		containers := append(yamlList(pod, "initContainers"), yamlList(pod, "containers")...)
		for _, c := range containers {
			name := yamlStr(c, "name")
			where := fmt.Sprintf("%s: container %s", w, name)
			ports := map[string]string{} // name or number -> number
			for _, p := range yamlList(c, "ports") {
				n := fmt.Sprint(yamlGet(p, "containerPort"))
				ports[n] = n
				if pn := yamlStr(p, "name"); pn != "" {
					ports[pn] = n
				}
			}
			for _, probe := range []string{"readinessProbe", "livenessProbe", "startupProbe"} {
				if p := yamlGet(c, probe, "httpGet", "port"); p != nil {
					if _, ok := ports[fmt.Sprint(p)]; !ok {
						t.Errorf("%s: %s's port %v is not a port the container declares", where, probe, p)
					}
				}
			}
			for _, vm := range yamlList(c, "volumeMounts") {
				v := yamlStr(vm, "name")
				if _, ok := volumes[v]; !ok {
					t.Errorf("%s: mounts volume %q, which the pod does not have", where, v)
				}
				volumes[v] = true
			}
			for _, e := range yamlList(c, "env") {
				if n := yamlStr(e, "name"); strings.HasPrefix(n, "ROLLBOX_") && !env[n] {
					t.Errorf("%s: sets %s, which rollbox does not read (cmd/rollbox/config.go)", where, n)
				}
			}
			checkHardened(t, where, yamlGet(pod, "securityContext"), yamlGet(c, "securityContext"), annotations)

			argv := append(yamlStrs(c, "command"), yamlStrs(c, "args")...)
			if len(argv) == 0 || argv[0] != "rollbox" {
				continue
			}
			ran++
			flags, err := parseRollbox(argv[1:])
			if err != nil {
				t.Errorf("%s: %s: %v", where, strings.Join(argv, " "), err)
				continue
			}
			if b, ok := flags["backend"]; ok {
				if err := sandbox.CheckBackend(b); err != nil {
					t.Errorf("%s: --backend: %v", where, err)
				}
			}
			if u, ok := flags["cluster"]; ok {
				checkNATSURL(t, where, u, byKind["Service"])
			}
			checkWritable(t, where, c, flags)
			for _, f := range []string{"addr", "health-addr"} {
				a, ok := flags[f]
				if !ok {
					continue
				}
				_, port, err := net.SplitHostPort(a)
				if err != nil {
					t.Errorf("%s: --%s %q: %v", where, f, a, err)
				} else if _, ok := ports[port]; !ok {
					t.Errorf("%s: listens on --%s %s, a port the container does not declare", where, f, a)
				}
			}
		}
		for v, used := range volumes {
			if !used {
				t.Errorf("%s: volume %q is mounted by no container", w, v)
			}
		}
	}
	if ran < 3 {
		t.Errorf("only %d containers run rollbox: the manifests should run the coordinator and workers", ran)
	}

	t.Run("Services select a workload and target its ports", func(t *testing.T) {
		for _, s := range byKind["Service"] {
			sel, _ := yamlGet(s.obj, "spec", "selector").(map[string]any)
			var target *manifest
			for _, w := range docs {
				labels, _ := yamlGet(w.obj, "spec", "template", "metadata", "labels").(map[string]any)
				if slices.Contains(workloadKinds, w.kind()) && w.namespace() == s.namespace() && labelsMatch(sel, labels) {
					target = &w
					break
				}
			}
			if target == nil {
				t.Errorf("%s: selector %v selects no workload of the manifests", s, sel)
				continue
			}
			for _, p := range yamlList(s.obj, "spec", "ports") {
				tp := fmt.Sprint(yamlGet(p, "targetPort"))
				if yamlGet(p, "targetPort") == nil {
					tp = fmt.Sprint(yamlGet(p, "port"))
				}
				found := false
				for _, c := range yamlList(target.obj, "spec", "template", "spec", "containers") {
					for _, cp := range yamlList(c, "ports") {
						if yamlStr(cp, "name") == tp || fmt.Sprint(yamlGet(cp, "containerPort")) == tp {
							found = true
						}
					}
				}
				if !found {
					t.Errorf("%s: port %v targets %s, which %s does not declare", s, yamlGet(p, "port"), tp, target)
				}
			}
		}
	})
}

// parseRollbox finds the command argv names in the real command tree and
// parses its flags with the command's own flag set, as rollbox would; it
// returns the flags set, by name.
func parseRollbox(argv []string) (map[string]string, error) {
	root := newRoot(&cliEnv{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard})
	cmd, rest, err := root.Find(argv)
	if err != nil {
		return nil, err
	}
	if cmd == root || !cmd.Runnable() {
		return nil, fmt.Errorf("%q is not a rollbox command", strings.Join(argv, " "))
	}
	if cmd.Hidden {
		return nil, fmt.Errorf("%s is a hidden command, run by rollbox itself", cmd.CommandPath())
	}
	if err := cmd.ParseFlags(rest); err != nil {
		return nil, err
	}
	if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
		return nil, err
	}
	if err := cmd.ValidateRequiredFlags(); err != nil {
		return nil, err
	}
	set := map[string]string{}
	cmd.Flags().Visit(func(f *pflag.Flag) { set[f.Name] = f.Value.String() })
	return set, nil
}

// checkNATSURL checks that a --cluster URL dials a Service of the
// manifests (NAME.NAMESPACE.svc[.cluster.local], or NAME) on a port it has.
func checkNATSURL(t *testing.T, where, raw string, services map[string]manifest) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "nats" || u.Port() == "" {
		t.Errorf("%s: --cluster %q is not nats://HOST:PORT", where, raw)
		return
	}
	labels := strings.Split(u.Hostname(), ".")
	ns := "rollbox"
	if len(labels) > 1 {
		ns = labels[1]
	}
	s, ok := services[ns+"/"+labels[0]]
	if !ok {
		t.Errorf("%s: --cluster %s: no Service %s in namespace %s among the manifests", where, raw, labels[0], ns)
		return
	}
	for _, p := range yamlList(s.obj, "spec", "ports") {
		if fmt.Sprint(yamlGet(p, "port")) == u.Port() {
			return
		}
	}
	t.Errorf("%s: --cluster %s: Service %s has no port %s", where, raw, labels[0], u.Port())
}

// checkWritable checks that what a rollbox container writes lies on a
// volume it mounts writable (its root file system is read-only): --data,
// the cache, the leases, Go's build cache and the temporary directory
// (where a worker without --data keeps its journals).
func checkWritable(t *testing.T, where string, c any, flags map[string]string) {
	t.Helper()
	envs := map[string]string{}
	for _, e := range yamlList(c, "env") {
		envs[yamlStr(e, "name")] = yamlStr(e, "value")
	}
	paths := map[string]string{"the temporary directory": cmp.Or(envs["TMPDIR"], "/tmp")}
	if d, ok := flags["data"]; ok {
		paths["--data"] = d
	}
	for _, n := range []string{"ROLLBOX_CACHE", "ROLLBOX_LEASE_DIR", "GOCACHE"} {
		if v := envs[n]; v != "" {
			paths[n] = v
		}
	}
	for what, p := range paths {
		ok := false
		for _, vm := range yamlList(c, "volumeMounts") {
			mp := strings.TrimSuffix(yamlStr(vm, "mountPath"), "/")
			if (p == mp || strings.HasPrefix(p, mp+"/")) && yamlGet(vm, "readOnly") != true {
				ok = true
			}
		}
		if !ok {
			t.Errorf("%s: %s %s is on no writable volume the container mounts (its root file system is read-only)", where, what, p)
		}
	}
}

// checkHardened checks a container's effective security context: either
// privileged, with the pod template's rollbox.dev/privileged-because
// annotation saying why, or no privilege escalation, every capability
// dropped, a read-only root, not root, and a seccomp profile.
func checkHardened(t *testing.T, where string, pod, ctr any, annotations map[string]any) {
	t.Helper()
	eff := func(keys ...string) any {
		if v := yamlGet(ctr, keys...); v != nil {
			return v
		}
		return yamlGet(pod, keys...)
	}
	if eff("privileged") == true {
		if why, _ := annotations["rollbox.dev/privileged-because"].(string); strings.TrimSpace(why) == "" {
			t.Errorf("%s: privileged without a rollbox.dev/privileged-because annotation on the pod template", where)
		}
		if yamlGet(ctr, "readOnlyRootFilesystem") != true {
			t.Errorf("%s: privileged, and its root file system is writable", where)
		}
		return
	}
	if yamlGet(ctr, "allowPrivilegeEscalation") != false {
		t.Errorf("%s: allowPrivilegeEscalation is not false", where)
	}
	if !slices.Contains(yamlStrs(ctr, "capabilities", "drop"), "ALL") {
		t.Errorf("%s: does not drop ALL capabilities", where)
	}
	if yamlGet(ctr, "readOnlyRootFilesystem") != true {
		t.Errorf("%s: readOnlyRootFilesystem is not true", where)
	}
	// Root without capabilities is allowed beside a privileged container
	// (writing the node's root-owned paths it shares).
	if uid, _ := eff("runAsUser").(int); eff("runAsNonRoot") != true && uid == 0 && annotations["rollbox.dev/privileged-because"] == nil {
		t.Errorf("%s: may run as root (no runAsNonRoot, no runAsUser above 0)", where)
	}
	if eff("seccompProfile", "type") == nil {
		t.Errorf("%s: no seccompProfile", where)
	}
}

// labelsMatch reports whether every label of sel is in labels (and sel is
// not empty).
func labelsMatch(sel, labels map[string]any) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if fmt.Sprint(labels[k]) != fmt.Sprint(v) {
			return false
		}
	}
	return true
}
