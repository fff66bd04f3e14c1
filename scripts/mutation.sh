#!/usr/bin/env bash
# Mutation testing of the core (docs/testing.md, "Mutation score"): one
# operator of a package's code is changed at a time (a mutant) and the
# package's tests are run; the mutant is killed when a test fails (or times
# out). Prints one score line per package; the survivors are listed above it.
#
#   scripts/mutation.sh [bin]                  every measured package
#   MUTATION_PKGS="envelope ledger" scripts/mutation.sh
#   MUTATION_WORKERS=2 scripts/mutation.sh     mutants tested at once (default 1)
#   MUTATION_TOOL=gremlins scripts/mutation.sh gremlins v0.6.0 instead
#   MUTATION_SEED=N scripts/mutation.sh       mutants in a shuffled order (a run
#                                              stopped early measured a random sample)
#   MUTATION_ALSO_executor=recovery,pipeline   other packages whose tests may kill
#                                              the package's mutants (defaults: recovery's
#                                              for the executor, the executor's and
#                                              pipeline's for admission, the executor's
#                                              and recovery's for ledger; empty for none)
#
# By default each mutant runs against only the tests that ran its
# statement (scripts/mutants: a coverage profile per test, taken once); with
# MUTATION_TOOL=gremlins, against the package's whole suite, as gremlins
# does, which takes hours for recovery. Both make the same mutants.
# Tests run against the real Postgres, like the rest of the suite.
#
#   scripts/mutation.sh one PKG FILE:LINE:COL MUTATOR [-run REGEXP]
#
# tries one mutant, as both name it, against the tests REGEXP selects (by
# default those that enter its function): a survivor is checked this way
# once its test is written.
set -euo pipefail
cd "$(dirname "$0")/.."

go=${GO:-go}

if [ "${1:-}" = one ]; then
	pkg=$2 pos=$3 mutator=$4
	shift 4
	# The tests to run: "-run REGEXP" (as go test takes it) or REGEXP.
	[ "${1:-}" = -run ] && shift
	exec $go run ./scripts/mutants -only "$pos:$mutator" ${1:+-run "$1"} "$pkg"
fi
bin=$(mkdir -p "${1:-bin}" && cd "${1:-bin}" && pwd)
tool=${MUTATION_TOOL:-targeted}
case $tool in
targeted) ;;
gremlins)
	version=v0.6.0
	gremlins=$bin/gremlins
	if ! [ -x "$gremlins" ] || ! $go version -m "$gremlins" 2>/dev/null | grep -q "mod.*github.com/go-gremlins/gremlins.*$version"; then
		echo "installing gremlins $version into $bin"
		GOBIN=$bin $go install "github.com/go-gremlins/gremlins/cmd/gremlins@$version"
	fi
	;;
*)
	echo "MUTATION_TOOL: $tool is neither targeted nor gremlins" >&2
	exit 2
	;;
esac

# The measured packages, whole: the providers, replay and the commands are
# not measured. MUTATION_EXCLUDE_<pkg> (a regular expression of paths) sets
# files of a package aside.
pkgs=${MUTATION_PKGS:-envelope ledger recovery outbox admission executor pipeline transcript}
declare -A exclude=()
for pkg in $pkgs; do
	var=MUTATION_EXCLUDE_$pkg
	exclude[$pkg]=${!var:-}
done
# MUTATION_ALSO_<pkg> (comma-separated) names other packages whose tests
# run the package's code and may kill its mutants (targeted mode only):
# recovery's tests run continuations through the executor; the executor's
# and the Kafka handler's admit permission replies (admit_reply.go); the
# executor's and recovery's run the ledger's attempts and resolutions.
declare -A also=([executor]=recovery [admission]=executor,pipeline [ledger]=executor,recovery)
for pkg in $pkgs; do
	var=MUTATION_ALSO_$pkg
	also[$pkg]=${!var-${also[$pkg]:-}}
done

# Survivors that no test can kill: the mutant behaves like the code
# (docs/testing.md says why for each). "package file:line:column MUTATOR".
# A change to the file moves them; a moved one shows up as lived again.
equivalent=$(
	cat <<-'EOF'
		envelope envelope.go:51:67 ARITHMETIC_BASE
		envelope envelope.go:170:9 CONDITIONALS_BOUNDARY
		envelope envelope.go:345:7 ARITHMETIC_BASE
		envelope envelope.go:345:10 CONDITIONALS_BOUNDARY
		envelope envelope.go:390:12 CONDITIONALS_BOUNDARY
		executor delta_stream.go:75:8 INCREMENT_DECREMENT
		executor executor.go:273:10 INCREMENT_DECREMENT
		executor panic.go:61:8 CONDITIONALS_BOUNDARY
		executor storable.go:86:22 CONDITIONALS_BOUNDARY
		executor response_id.go:117:13 CONDITIONALS_BOUNDARY
		executor tool_call.go:57:13 CONDITIONALS_NEGATION
		ledger attempt.go:181:20 CONDITIONALS_NEGATION
		ledger pipelined.go:322:51 CONDITIONALS_NEGATION
		ledger retry.go:125:11 CONDITIONALS_BOUNDARY
		outbox relay.go:468:15 CONDITIONALS_BOUNDARY
		outbox relay.go:484:17 CONDITIONALS_BOUNDARY
		recovery rate.go:56:24 ARITHMETIC_BASE
		recovery rate.go:111:13 CONDITIONALS_BOUNDARY
		recovery rate.go:113:32 CONDITIONALS_BOUNDARY
		recovery mode.go:285:31 CONDITIONALS_BOUNDARY
		recovery redrive.go:22:8 CONDITIONALS_BOUNDARY
		replay replayer.go:204:17 CONDITIONALS_BOUNDARY
		replay replayer.go:438:64 CONDITIONALS_NEGATION
	EOF
)

out=$(mktemp -d -t promptline-mutation.XXXXXX)
summary=()
for pkg in $pkgs; do
	# A mutant's timeout is the coverage run's time by this coefficient;
	# envelope's tests take milliseconds and its runs are all compilation.
	coefficient=${MUTATION_TIMEOUT_COEFFICIENT:-$([ "$pkg" = envelope ] && echo 10 || echo 5)}
	echo "== $pkg"
	start=$(date +%s)
	if [ "$tool" = targeted ]; then
		$go run ./scripts/mutants -workers "${MUTATION_WORKERS:-1}" -timeout-coefficient "$coefficient" -seed "${MUTATION_SEED:-0}" \
			-exclude "${exclude[$pkg]:-}" -also "${also[$pkg]:-}" "$pkg" | tee "$out/$pkg.txt" | grep -E -A1 'LIVED|TIMED OUT|NOT COVERED|NOT VIABLE|ERROR' || true
	else
		args=(unleash --workers "${MUTATION_WORKERS:-1}" --timeout-coefficient "$coefficient" -S ltc)
		if [ -n "${exclude[$pkg]:-}" ]; then
			args+=(-E "${exclude[$pkg]}")
		fi
		# -count=1: a cached coverage run would time the tests at ~0 s, and
		# gremlins derives each mutant's timeout from that time.
		GOFLAGS=-count=1 "$gremlins" "${args[@]}" "./$pkg" | tee "$out/$pkg.txt" | grep -E 'LIVED|TIMED OUT|NOT COVERED' || true
	fi
	secs=$(($(date +%s) - start))
	read -r killed lived uncovered < <(sed -nE 's/^Killed: ([0-9]+), Lived: ([0-9]+), Not covered: ([0-9]+).*/\1 \2 \3/p' "$out/$pkg.txt")
	timedout=$(sed -nE 's/^Timed out: ([0-9]+).*/\1/p' "$out/$pkg.txt")
	if [ -z "${killed:-}" ] || [ -z "${timedout:-}" ]; then
		echo "mutation $pkg: gremlins did not finish (output in $out/$pkg.txt)"
		summary+=("mutation $pkg: no result")
		continue
	fi
	equiv=0
	while read -r where mutator; do
		if grep -qE "LIVED +$mutator at ${where//./\\.}\$" "$out/$pkg.txt"; then
			equiv=$((equiv + 1))
		fi
	done < <(awk -v p="$pkg" '$1 == p { print $2, $3 }' <<<"$equivalent")
	dead=$((killed + timedout))
	run=$((dead + lived - equiv))
	all=$((run + uncovered))
	line=$(awk -v p="$pkg" -v d="$dead" -v r="$run" -v a="$all" -v l="$((lived - equiv))" -v e="$equiv" -v u="$uncovered" -v s="$secs" 'BEGIN {
		printf "mutation %s: %.1f%% killed (%d of %d run, %d lived, %d equivalent set aside); %d not covered (%.1f%% of all %d); %dm%02ds",
			p, r ? 100 * d / r : 100, d, r, l, e, u, a ? 100 * d / a : 100, a, s / 60, s % 60 }')
	echo "$line"
	summary+=("$line")
done
echo
printf '%s\n' "${summary[@]}"
