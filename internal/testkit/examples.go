package testkit

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// The producer examples in other languages (examples/java, examples/python)
// are part of the tested contract (docs/producers.md): their tools missing
// fails the test, and what they need from a package registry is resolved
// here, once per checkout: Maven's local repository and the virtual
// environment keep it, so later runs start offline.

// examplesDir is the repository's examples directory.
func examplesDir(tb testing.TB) string {
	tb.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		tb.Fatal("locating internal/testkit")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "examples")
}

// lockDir holds an exclusive lock on dir/name until the returned function
// is called: test binaries of several packages run at once, and two builds
// of one example must not write its output together.
func lockDir(tb testing.TB, dir, name string) func() {
	tb.Helper()
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_RDWR, 0o644)
	must(tb, err)
	must(tb, syscall.Flock(int(f.Fd()), syscall.LOCK_EX))
	return func() { f.Close() } // closing releases the lock
}

// newer reports whether every file of outs exists and is at least as new
// as every file of ins.
func newer(outs, ins []string) bool {
	var oldest time.Time
	for i, p := range outs {
		st, err := os.Stat(p)
		if err != nil {
			return false
		}
		if i == 0 || st.ModTime().Before(oldest) {
			oldest = st.ModTime()
		}
	}
	for _, p := range ins {
		st, err := os.Stat(p)
		if err != nil || st.ModTime().After(oldest) {
			return false
		}
	}
	return true
}

// JavaProducer returns the command that runs examples/java (the
// kafka-clients producer) with args, building it first when its pom or
// source changed: offline (mvn -o) when the local Maven repository already
// holds what it needs, online otherwise.
func JavaProducer(ctx context.Context, tb testing.TB, args ...string) *exec.Cmd {
	tb.Helper()
	SkipInShortTier(tb, "Java 17 and Maven (the Java producer example)")
	java, err := exec.LookPath("java")
	if err != nil {
		tb.Fatal("the Java producer example needs a Java 17 runtime (java) on PATH")
	}
	dir := filepath.Join(examplesDir(tb), "java")
	src := []string{filepath.Join(dir, "pom.xml"), filepath.Join(dir, "src", "main", "java", "promptline", "example", "Produce.java")}
	built := []string{filepath.Join(dir, "target", "classes", "promptline", "example", "Produce.class"), filepath.Join(dir, "target", "lib", "kafka-clients-4.4.0.jar")}
	unlock := lockDir(tb, dir, ".build.lock")
	defer unlock()
	if !newer(built, src) {
		mvn, err := exec.LookPath("mvn")
		if err != nil {
			tb.Fatal("the Java producer example needs Maven (mvn) on PATH")
		}
		// A dependency whose version changed would leave its old jar
		// beside the new one on the classpath.
		must(tb, os.RemoveAll(filepath.Join(dir, "target", "lib")))
		build := func(extra ...string) ([]byte, error) {
			cmd := exec.Command(mvn, append([]string{"-q", "-B", "package"}, extra...)...)
			cmd.Dir = dir
			return cmd.CombinedOutput()
		}
		if _, err := build("-o"); err != nil {
			if out, err := build(); err != nil {
				tb.Fatalf("building examples/java (mvn package): %v\n%s", err, out)
			}
		}
		// Maven leaves a file's time alone when it copies nothing new.
		now := time.Now()
		for _, p := range built {
			must(tb, os.Chtimes(p, now, now))
		}
	}
	cp := filepath.Join(dir, "target", "classes") + string(os.PathListSeparator) + filepath.Join(dir, "target", "lib", "*")
	cmd := exec.CommandContext(ctx, java, append([]string{"-XX:TieredStopAtLevel=1", "-cp", cp, "promptline.example.Produce"}, args...)...)
	cmd.Dir = dir
	return cmd
}

// PythonProducer returns the command that runs examples/python/produce.py
// (confluent-kafka) with args, in the example's virtual environment
// (examples/python/.venv), which it creates from requirements.txt when it
// is missing or the requirements changed.
func PythonProducer(ctx context.Context, tb testing.TB, args ...string) *exec.Cmd {
	tb.Helper()
	SkipInShortTier(tb, "Python 3 with venv (the Python producer example)")
	dir := filepath.Join(examplesDir(tb), "python")
	venv := filepath.Join(dir, ".venv")
	python := filepath.Join(venv, "bin", "python")
	stamp := filepath.Join(venv, "requirements.installed")
	want, err := os.ReadFile(filepath.Join(dir, "requirements.txt"))
	must(tb, err)
	unlock := lockDir(tb, dir, ".venv.lock")
	defer unlock()
	if have, err := os.ReadFile(stamp); err != nil || !bytes.Equal(have, want) {
		python3, err := exec.LookPath("python3")
		if err != nil {
			tb.Fatal("the Python producer example needs Python 3 (python3) on PATH")
		}
		for _, argv := range [][]string{
			{python3, "-m", "venv", venv},
			{python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r", "requirements.txt"},
		} {
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Dir = dir
			if out, err := cmd.CombinedOutput(); err != nil {
				tb.Fatalf("preparing examples/python (%v): %v\n%s", argv, err, out)
			}
		}
		must(tb, os.WriteFile(stamp, want, 0o644))
	}
	cmd := exec.CommandContext(ctx, python, append([]string{"produce.py"}, args...)...)
	cmd.Dir = dir
	return cmd
}
