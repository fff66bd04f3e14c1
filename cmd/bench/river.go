package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// riverResult is River's no-op burn-down on the same Postgres.
type riverResult struct {
	Jobs    int `json:"jobs"`
	Workers int `json:"workers"`
	// FetchCooldownMS and FetchPollIntervalMS are the peer client's fetch
	// pacing (cmd/bench/river says why they are not River's defaults).
	FetchCooldownMS     float64 `json:"fetch_cooldown_ms"`
	FetchPollIntervalMS float64 `json:"fetch_poll_interval_ms"`
	Seconds             float64 `json:"seconds"`
	JobsPerSecond       float64 `json:"jobs_per_second"`
}

// riverModuleDir is the peer's module (cmd/bench/river), found from the
// main module's go.mod: River stays out of promptline's go.mod.
func riverModuleDir(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run the bench inside promptline's module: River's burn-down is its module cmd/bench/river")
	}
	return filepath.Join(filepath.Dir(mod), "cmd", "bench", "river"), nil
}

// measureRiver builds cmd/bench/river and runs it on a fresh scratch
// database: jobs no-op jobs inserted, then a client with workers workers,
// timed by the peer from its Start to the last job completed.
func measureRiver(ctx context.Context, sc *scratchServer, jobs, workers int, progress func(string, ...any)) (res riverResult, err error) {
	dir, err := riverModuleDir(ctx)
	if err != nil {
		return res, err
	}
	tmp, err := os.MkdirTemp("", "promptline-bench-river-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "river")
	progress("River: building the peer (%s)", filepath.Base(dir))
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		return res, fmt.Errorf("building cmd/bench/river: %w\n%s", err, out)
	}
	db, err := sc.create(ctx, poolOpts{MaxConns: 1})
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, db.drop(ctx)) }()
	db.Pool.Close() // the peer brings its own pool
	progress("River: %d no-op jobs, %d workers", jobs, workers)
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "--database-url", sc.dbURL(db.Name), "--jobs", fmt.Sprint(jobs),
		"--workers", fmt.Sprint(workers), "--db-max-conns", fmt.Sprint(consumerMaxConns))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return res, fmt.Errorf("the River burn-down: %w\n%s", err, tail(stderr.String(), 20))
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		return res, fmt.Errorf("reading River's result %q: %w", stdout.String(), err)
	}
	return res, nil
}
