// Package compose_test checks what can be checked of the deployments
// without a Docker engine or a Kubernetes cluster: the compose file and
// every Kubernetes manifest parse (multi-document YAML) and hold the fields
// the deployment relies on, every flag they pass exists, and the
// Dockerfile's `go build` line, run here as written, builds a static
// binary. Running the stack itself is `docker compose up` (docs/deploy.md).
package compose_test

import (
	"bytes"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

const repoRoot = "../.."

// afterGrace is what a stop may take past --shutdown-grace when the
// database answers nothing (README, --shutdown-grace): the outcomes of
// what the grace cut off, written once (the executor's afterCancelTimeout,
// 10 s), the relay's last pass (stopFlushTimeout, 5 s), the connections
// closed (pgdb's closeWait, 2 s), and a margin.
const afterGrace = 20 * time.Second

// docs decodes every YAML document of a file.
func docs(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var out []map[string]any
	for {
		var d map[string]any
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, path)
		if d != nil {
			out = append(out, d)
		}
	}
	require.NotEmpty(t, out, path)
	return out
}

// at walks a decoded document: string keys for maps, ints for lists.
func at(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			require.True(t, ok, "%v: not a map at %q", path, k)
			v, ok = m[k]
			require.True(t, ok, "%v: no key %q", path, k)
		case int:
			l, ok := v.([]any)
			require.True(t, ok, "%v: not a list at %d", path, k)
			require.Greater(t, len(l), k, "%v", path)
			v = l[k]
		}
	}
	return v
}

func strs(t *testing.T, v any) []string {
	t.Helper()
	l, ok := v.([]any)
	require.True(t, ok, "%v is not a list", v)
	out := make([]string, 0, len(l))
	for _, x := range l {
		s, ok := x.(string)
		require.True(t, ok, "%v is not a string", x)
		out = append(out, s)
	}
	return out
}

// flagValue returns the value of --name=value in args.
func flagValue(t *testing.T, args []string, name string) string {
	t.Helper()
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	require.FailNow(t, "flag not set", "--%s in %v", name, args)
	return ""
}

var (
	buildOnce sync.Once
	buildBin  string
	buildErr  error
	buildDir  string
)

// dockerfileBuild runs the Dockerfile's `go build` line as it stands, with
// only its output path moved to a temporary directory, and returns the
// binary.
func dockerfileBuild(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		b, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
		if err != nil {
			buildErr = err
			return
		}
		var line string
		for l := range strings.Lines(string(b)) {
			if strings.HasPrefix(l, "RUN ") && strings.Contains(l, " go build ") {
				line = strings.TrimSpace(strings.TrimPrefix(l, "RUN "))
			}
		}
		if line == "" {
			buildErr = errors.New("Dockerfile: no `RUN ... go build` line")
			return
		}
		fields := strings.Fields(line)
		var env []string
		for len(fields) > 0 && strings.Contains(fields[0], "=") {
			env = append(env, fields[0])
			fields = fields[1:]
		}
		if len(fields) < 2 || fields[0] != "go" || fields[1] != "build" {
			buildErr = errors.New("Dockerfile: the build line is not `[ENV=...] go build ...`: " + line)
			return
		}
		buildDir, buildErr = os.MkdirTemp("", "promptline-dockerfile-build-")
		if buildErr != nil {
			return
		}
		buildBin = filepath.Join(buildDir, "consumer")
		args := append([]string(nil), fields[1:]...)
		for i := range args {
			if args[i] == "-o" && i+1 < len(args) {
				args[i+1] = buildBin
			}
		}
		cmd := exec.Command("go", args...)
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = errors.New("go " + strings.Join(args, " ") + ": " + err.Error() + "\n" + string(out))
		}
	})
	require.NoError(t, buildErr)
	return buildBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

func TestDockerfile(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	require.NoError(t, err)
	df := string(b)
	require.Equal(t, 2, strings.Count(df, "\nFROM ")+boolInt(strings.HasPrefix(df, "FROM ")), "multi-stage: a build and a runtime stage")
	require.Regexp(t, `(?m)^RUN CGO_ENABLED=0 go build .* \./cmd/consumer$`, df)
	final := df[strings.LastIndex(df, "FROM "):]
	user := regexp.MustCompile(`(?m)^USER (\S+)`).FindStringSubmatch(final)
	require.NotNil(t, user, "the runtime stage sets USER")
	require.NotRegexp(t, `^(0|root)(:|$)`, user[1], "non-root")
	require.Regexp(t, `(?m)^ENTRYPOINT \["/usr/local/bin/consumer"\]$`, final)
	require.Contains(t, final, "COPY --from=build /out/consumer /usr/local/bin/consumer")

	t.Run("BuildsStaticBinary", func(t *testing.T) {
		bin := dockerfileBuild(t)
		f, err := elf.Open(bin)
		require.NoError(t, err)
		defer f.Close()
		for _, p := range f.Progs {
			require.NotEqual(t, elf.PT_INTERP, p.Type, "a static binary has no ELF interpreter (CGO_ENABLED=0)")
		}
		libs, err := f.ImportedLibraries()
		require.NoError(t, err)
		require.Empty(t, libs)
		out, err := exec.Command(bin, "migrate", "--help").CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "Apply the embedded, forward-only migrations")
	})
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// requireFlagsExist runs `consumer [sub] --help` and checks that every
// --flag in args is listed.
func requireFlagsExist(t *testing.T, args []string) {
	t.Helper()
	bin := dockerfileBuild(t)
	helpArgs := []string{"--help"}
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		helpArgs = []string{args[0], "--help"}
	}
	out, err := exec.Command(bin, helpArgs...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, a := range args {
		if name, ok := strings.CutPrefix(a, "--"); ok {
			name, _, _ = strings.Cut(name, "=")
			require.Contains(t, string(out), "--"+name+" ", "consumer %v has no flag --%s", helpArgs[:len(helpArgs)-1], name)
		}
	}
}

func TestCompose(t *testing.T) {
	t.Parallel()
	d := docs(t, "docker-compose.yml")
	require.Len(t, d, 1)
	services := at(t, d[0], "services").(map[string]any)
	for _, s := range []string{"kafka", "topics", "postgres", "migrate", "consumer", "prometheus", "grafana"} {
		require.Contains(t, services, s)
	}

	t.Run("KafkaKRaft", func(t *testing.T) {
		require.Regexp(t, `^apache/kafka:`, at(t, services, "kafka", "image"))
		require.Equal(t, "broker,controller", at(t, services, "kafka", "environment", "KAFKA_PROCESS_ROLES"))
		require.NotContains(t, services, "zookeeper")
	})
	t.Run("MigrateThenThreeConsumers", func(t *testing.T) {
		require.Equal(t, []string{"migrate"}, strs(t, at(t, services, "migrate", "command")))
		require.Contains(t, at(t, services, "migrate", "environment", "DATABASE_URL"), "promptline_owner")
		consumer := at(t, services, "consumer")
		require.Equal(t, 3, at(t, consumer, "deploy", "replicas"))
		require.Equal(t, "service_completed_successfully", at(t, consumer, "depends_on", "migrate", "condition"))
		require.Contains(t, at(t, consumer, "environment", "DATABASE_URL"), "promptline_app")
		args := strs(t, at(t, consumer, "command"))
		require.Equal(t, "false", flagValue(t, args, "migrate"))
		require.Equal(t, "kafka:9092", flagValue(t, args, "brokers"), "never the embedded broker")
		grace, err := time.ParseDuration(flagValue(t, args, "shutdown-grace"))
		require.NoError(t, err)
		stop, err := time.ParseDuration(at(t, consumer, "stop_grace_period").(string))
		require.NoError(t, err)
		require.GreaterOrEqual(t, stop, grace+afterGrace, "stop_grace_period must leave the stop its time after --shutdown-grace")
		requireFlagsExist(t, args)
		requireFlagsExist(t, strs(t, at(t, services, "migrate", "command")))
	})
	t.Run("MountedFilesExist", func(t *testing.T) {
		// Prometheus gets the shipped rules, Grafana the dashboard,
		// Postgres the roles: every bind mount names a file here.
		var mounts []string
		for _, s := range []string{"postgres", "prometheus", "grafana"} {
			for _, v := range strs(t, at(t, services, s, "volumes")) {
				if src, _, _ := strings.Cut(v, ":"); strings.HasPrefix(src, ".") {
					mounts = append(mounts, src)
					require.FileExists(t, src, "%s mounts %s", s, src)
				}
			}
		}
		require.Contains(t, mounts, "../prometheus/alerts.yml")
		require.Contains(t, mounts, "../grafana/promptline.json")
		require.Contains(t, mounts, "../postgres/roles.sql")
		prom := docs(t, "prometheus.yml")[0]
		require.Equal(t, []string{"/etc/prometheus/rules/alerts.yml"}, strs(t, at(t, prom, "rule_files")))
		for _, f := range []string{"grafana/datasources.yml", "grafana/dashboards.yml"} {
			require.NotNil(t, at(t, docs(t, f)[0], "apiVersion"), f)
		}
	})
}

func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../kubernetes/*.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	byKind := map[string][]map[string]any{}
	for _, f := range files {
		for _, d := range docs(t, f) {
			kind, _ := d["kind"].(string)
			require.NotEmpty(t, kind, f)
			require.NotEmpty(t, d["apiVersion"], f)
			if kind != "Kustomization" {
				require.NotEmpty(t, at(t, d, "metadata", "name"), f)
			}
			byKind[kind] = append(byKind[kind], d)
		}
		// A database URL is never inline: only Secret references.
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for l := range strings.Lines(string(b)) {
			if !strings.HasPrefix(strings.TrimSpace(l), "#") {
				require.NotContains(t, l, "postgres://", "%s: a database URL belongs in a Secret", f)
			}
		}
	}
	for _, k := range []string{"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "Job", "Kustomization"} {
		require.Len(t, byKind[k], 1, k)
	}
	require.NotContains(t, byKind, "Secret", "Secrets are created by the operator, never shipped")

	dep := byKind["Deployment"][0]
	labels := at(t, dep, "spec", "template", "metadata", "labels")
	podSpec := at(t, dep, "spec", "template", "spec")
	c := at(t, podSpec, "containers", 0)
	args := strs(t, at(t, c, "args"))

	t.Run("Deployment", func(t *testing.T) {
		require.GreaterOrEqual(t, at(t, dep, "spec", "replicas"), 2)
		require.Equal(t, at(t, dep, "spec", "selector", "matchLabels"), labels)
		require.Equal(t, "/readyz", at(t, c, "readinessProbe", "httpGet", "path"))
		require.Equal(t, "/healthz", at(t, c, "livenessProbe", "httpGet", "path"))
		require.Equal(t, "metrics", at(t, c, "readinessProbe", "httpGet", "port"))
		require.Equal(t, "metrics", at(t, c, "ports", 0, "name"))
		require.Equal(t, 9464, at(t, c, "ports", 0, "containerPort"))
		require.Regexp(t, `:9464$`, flagValue(t, args, "metrics-addr"))
		require.NotRegexp(t, `^127\.`, flagValue(t, args, "metrics-addr"), "probes come from outside the container")
		require.NotEmpty(t, at(t, c, "resources", "requests", "cpu"))
		require.NotEmpty(t, at(t, c, "resources", "requests", "memory"))
		grace, err := time.ParseDuration(flagValue(t, args, "shutdown-grace"))
		require.NoError(t, err)
		term := at(t, podSpec, "terminationGracePeriodSeconds").(int)
		require.GreaterOrEqual(t, time.Duration(term)*time.Second, grace+afterGrace, "terminationGracePeriodSeconds must leave the stop its time after --shutdown-grace")
		require.Equal(t, "false", flagValue(t, args, "migrate"), "the runtime role does not migrate")
		require.NotEmpty(t, flagValue(t, args, "brokers"), "never the embedded broker")
		require.Equal(t, true, at(t, podSpec, "securityContext", "runAsNonRoot"))
		require.Equal(t, "DATABASE_URL", at(t, c, "env", 0, "name"))
		require.NotEmpty(t, at(t, c, "env", 0, "valueFrom", "secretKeyRef", "name"))
		requireFlagsExist(t, args)
	})
	t.Run("ConfigMapFeedsArgs", func(t *testing.T) {
		cm := byKind["ConfigMap"][0]
		require.Equal(t, at(t, cm, "metadata", "name"), at(t, c, "envFrom", 0, "configMapRef", "name"))
		data := at(t, cm, "data").(map[string]any)
		for _, ref := range regexp.MustCompile(`\$\((\w+)\)`).FindAllStringSubmatch(strings.Join(args, " "), -1) {
			require.Contains(t, data, ref[1], "args reference $(%s)", ref[1])
		}
	})
	t.Run("ServiceAndPDBSelectThePods", func(t *testing.T) {
		svc := byKind["Service"][0]
		require.Equal(t, labels, at(t, svc, "spec", "selector"))
		require.Equal(t, "metrics", at(t, svc, "spec", "ports", 0, "targetPort"))
		pdb := byKind["PodDisruptionBudget"][0]
		require.Equal(t, labels, at(t, pdb, "spec", "selector", "matchLabels"))
	})
	t.Run("MigrateJob", func(t *testing.T) {
		job := byKind["Job"][0]
		jc := at(t, job, "spec", "template", "spec", "containers", 0)
		jargs := strs(t, at(t, jc, "args"))
		require.Equal(t, "migrate", jargs[0])
		require.Equal(t, "DATABASE_URL", at(t, jc, "env", 0, "name"))
		owner := at(t, jc, "env", 0, "valueFrom", "secretKeyRef", "name")
		require.NotEqual(t, at(t, c, "env", 0, "valueFrom", "secretKeyRef", "name"), owner,
			"the Job migrates as the owner role, the consumers run as the runtime role")
		require.Equal(t, at(t, c, "image"), at(t, jc, "image"))
		requireFlagsExist(t, jargs)
	})
	t.Run("KustomizationListsEveryManifest", func(t *testing.T) {
		listed := strs(t, at(t, byKind["Kustomization"][0], "resources"))
		for _, f := range files {
			if base := filepath.Base(f); base != "kustomization.yaml" {
				require.Contains(t, listed, base)
			}
		}
	})
}
