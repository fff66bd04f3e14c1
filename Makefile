# promptline. `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
BIN := bin
# staticcheck, fetched by go itself through the module proxy once per
# version and kept in bin/ (make lint).
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(BIN)/staticcheck-$(STATICCHECK_VERSION)

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z/_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-12s %s\n", $$1, $$2}'

.PHONY: build
build: ## build bin/consumer and bin/producer
	$(GO) build -o $(BIN)/consumer ./cmd/consumer
	$(GO) build -o $(BIN)/producer ./cmd/producer

.PHONY: demo
demo: build ## run the consumer on embedded defaults, publish a few prompts, print the answers
	./scripts/demo.sh $(BIN)

.PHONY: test
test: lint examples/node/node_modules tools/mcp/testdata/server-filesystem/node_modules ## the default suite: lint (gofmt, vet, staticcheck), every test (real Postgres, embedded broker over TCP), fuzz seeds
	$(GO) test -count=1 -timeout 20m ./...

# The kafkajs producer example's package (tested in examples/).
examples/node/node_modules: examples/node/package.json examples/node/package-lock.json
	cd examples/node && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# The third-party MCP server of the MCP tool tests (tools/mcp, cmd/consumer).
tools/mcp/testdata/server-filesystem/node_modules: tools/mcp/testdata/server-filesystem/package.json tools/mcp/testdata/server-filesystem/package-lock.json
	cd tools/mcp/testdata/server-filesystem && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

.PHONY: test/short
test/short: ## the fast tier: the tests that need no Node, kcat, promtool, Java, Python nor consumer processes (go test -short; docs/testing.md)
	$(GO) test -short -count=1 ./...

# The suites that talk to a broker, against Apache Kafka instead of the
# embedded broker (docs/testing.md, "Apache Kafka"): a node per test, at most
# PROMPTLINE_TEST_KAFKA_JVMS (2) at once per package, one package at a time.
KAFKA_TESTS_CONSUMER := ^(TestKcatEndToEnd|TestCrashAfter.*|TestCrashBefore.*|TestCrashDuring.*|TestTwoConsumersOneGroupWithRebalance|TestTwoGroupsEachPromptRunsOnce|TestZombieIsFenced|TestGracefulShutdownReleasesWithWake|TestPermissionRepliesAcrossRestart|TestReplayCommand|TestScaleOutKillOne|TestMassCrashHeldThenApplied|TestWatchDeltasLive|TestCrashWhileStreaming|TestResolveAfterCrashedToolIntent|TestResolvedCallKilledAgain)$$
.PHONY: test/kafka
test/kafka: examples/node/node_modules tools/mcp/testdata/server-filesystem/node_modules ## the integration, interop, crash, zombie, replay and permission tests and a 45s chaos soak against Apache Kafka (kafka/pom.xml; Java 17, Maven)
	./scripts/kafka.sh libs >/dev/null
	PROMPTLINE_TEST_KAFKA=apache $(GO) test -count=1 -p 1 -timeout 60m ./internal/testkit ./internal/kafkautil ./outbox ./replay ./pipeline ./executor ./cmd/producer
	PROMPTLINE_TEST_KAFKA=apache $(GO) test -count=1 -p 1 -timeout 60m -run '$(KAFKA_TESTS_CONSUMER)' ./cmd/consumer
	$(MAKE) --no-print-directory chaos/kafka CHAOS_DURATION=$${CHAOS_DURATION:-45s}

.PHONY: test/browser
test/browser: ## the operator console in headless Chromium (Debian package chromium; CHROMIUM names another binary); screenshots in BROWSER_ARTIFACTS (bin/browser-artifacts)
	BROWSER_ARTIFACTS=$${BROWSER_ARTIFACTS:-$(CURDIR)/$(BIN)/browser-artifacts} $(GO) test -tags browser -count=1 -run '^TestConsoleInBrowser$$' -v ./cmd/consumer 2>&1 \
	  | grep -E '^(=== RUN|--- FAIL|FAIL|ok|PASS)|browser artifacts|Error( Trace)?:|Messages:|^ +FAIL ' ; exit $${PIPESTATUS[0]}

.PHONY: test/race
test/race: examples/node/node_modules tools/mcp/testdata/server-filesystem/node_modules ## the default suite under the race detector
	$(GO) test -race -count=1 -timeout 30m ./...

.PHONY: test/crash-sweep
test/crash-sweep: ## the crash sweep: SIGKILL before and after every commit of the scripted workload, a seeded subset of the HTTP leg's (docs/testing.md)
	CRASH_SWEEP=full CRASH_SWEEP_HTTP=$${CRASH_SWEEP_HTTP:-sample} CRASH_SWEEP_HTTP_RUNS=$${CRASH_SWEEP_HTTP_RUNS:-30} $(GO) test -count=1 -timeout 80m -parallel 3 -run '^TestCrashSweep$$' -v ./cmd/consumer 2>&1 \
	  | grep -E '^(=== RUN|--- FAIL|FAIL|ok|PASS)|crash sweep:|^ +FAIL |^ +--- FAIL|^panic:|^ +[a-z_]+_test\.go:[0-9]+: .*(should stop|did not exit|still running)|^[[:space:]]+(Error Trace|Error|Messages):' ; exit $${PIPESTATUS[0]}

.PHONY: test/db-faults
test/db-faults: ## database faults through a proxy: every ambiguous commit of the workload, cuts, stalls, terminated backends (docs/testing.md)
	DB_FAULTS=full $(GO) test -count=1 -timeout 60m -parallel 3 -run '^(TestAmbiguousCommitSweep|TestRandomConnectionCuts|TestTerminateBackendsDuringRecovery|TestReadyzReflectsDatabaseOutage|TestParkedTurnContinuedOnce|TestAmbiguousPromotionIsNotLost)$$' -v ./cmd/consumer 2>&1 \
	  | grep -E '^(=== RUN|--- FAIL|FAIL|ok|PASS)|ambiguous-commit sweep:|random connection cuts|pg_terminate_backend during|database outage:|^ +FAIL |^ +--- FAIL|^panic:|^ +[a-z_]+_test\.go:[0-9]+: .*(should stop|did not exit|still running)|^[[:space:]]+(Error Trace|Error|Messages):' ; exit $${PIPESTATUS[0]}

.PHONY: test/mutation
test/mutation: ## mutation score of ledger, recovery, outbox, envelope, admission, executor, pipeline and transcript (docs/testing.md; MUTATION_PKGS chooses)
	GO=$(GO) ./scripts/mutation.sh $(BIN)

.PHONY: chaos
chaos: ## the chaos soak: 3 consumers, a restartable broker, Postgres behind a proxy, random faults for CHAOS_DURATION (default 60s), then a checker's table (docs/testing.md)
	CHAOS_DURATION=$${CHAOS_DURATION:-60s} $(GO) test -tags chaos -count=1 -timeout 0 -run '^(TestChaosSoak|TestChaosZombieCheck)$$' -v ./cmd/consumer 2>&1 \
	  | grep -E '^(=== RUN|--- FAIL|FAIL|ok|PASS)|chaos |^ *\||panic|did not exit|should stop|Error( Trace)?:|Messages:|^ +FAIL ' ; exit $${PIPESTATUS[0]}

.PHONY: chaos/kafka
chaos/kafka: ## the chaos soak against an Apache Kafka node (broker-restart SIGKILLs the JVM); CHAOS_DURATION (default 60s; 45s in test/kafka)
	./scripts/kafka.sh libs >/dev/null
	PROMPTLINE_TEST_KAFKA=apache CHAOS_DURATION=$${CHAOS_DURATION:-60s} $(GO) test -tags chaos -count=1 -timeout 30m -run '^TestChaosSoak$$' -v ./cmd/consumer 2>&1 \
	  | grep -E '^(=== RUN|--- FAIL|FAIL|ok|PASS)|chaos |^ *\||panic|did not exit|should stop|Error( Trace)?:|Messages:|^ +FAIL |Apache Kafka' ; exit $${PIPESTATUS[0]}

.PHONY: kafka
kafka: ## Apache Kafka (kafka/pom.xml's version) in the foreground: KAFKA_NODES=1 or 3 nodes on loopback; prints its --brokers list; Ctrl-C stops it
	./scripts/kafka.sh run $${KAFKA_NODES:-1}

.PHONY: lint
lint: $(STATICCHECK) ## gofmt, go vet and staticcheck (staticcheck.conf), also with the faults, chaos and apachekafka build tags
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags faults ./...
	$(GO) vet -tags browser ./cmd/consumer
	$(GO) vet -tags chaos,faults ./cmd/consumer
	$(GO) vet -tags apachekafka ./cmd/consumer
	$(STATICCHECK) ./...
	$(STATICCHECK) -tags chaos,faults ./...
	$(STATICCHECK) -tags apachekafka ./cmd/consumer ./internal/testkit

$(STATICCHECK):
	GOBIN=$(abspath $(BIN))/.staticcheck $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(BIN)/.staticcheck/staticcheck $@ && rmdir $(BIN)/.staticcheck

.PHONY: bench
bench: ## print admission throughput, the raw ceiling, end-to-end latency, the burn-down figures, ten thousand turns in flight, relay figures, a paced mass recovery (BENCH_FLAGS='--kafka both': also on Apache Kafka)
	$(GO) run ./cmd/bench $(BENCH_FLAGS)
	$(GO) run ./cmd/bench inflight
	$(GO) test -run '^$$' -bench . -benchtime 2x ./outbox
	$(GO) test -run '^$$' -bench BenchmarkRecoveryRate -benchtime 1x -timeout 20m ./recovery

.PHONY: bench/recovery
bench/recovery: ## print a mass recovery paced by --recovery-rate: 10,000 expired claims, two recoverers, decisions per second (RECOVERY_BENCH_FLAGS='-recovery-bench.rate 0': unbounded)
	$(GO) test -run '^$$' -bench BenchmarkRecoveryRate -benchtime 1x -timeout 20m ./recovery $(RECOVERY_BENCH_FLAGS)

.PHONY: bench/inflight
bench/inflight: ## print ten thousand turns in flight: one consumer process on an Apache Kafka node, 1,000 prompts/s for 30s each sleeping 10s, then a burst of 10,000 (Java 17, Maven)
	$(GO) run ./cmd/bench inflight

.PHONY: bench/latency
bench/latency: ## print end-to-end latency at 1,000 prompts/s only (the executor's path)
	$(GO) run ./cmd/bench --latency-only

.PHONY: fuzz
fuzz: ## fuzz the envelope decoder for a minute
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 60s -fuzzminimizetime 2s ./envelope

.PHONY: clean
clean: ## remove built binaries
	rm -rf $(BIN)
